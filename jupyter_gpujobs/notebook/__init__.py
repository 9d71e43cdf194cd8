"""What runs in a user's kernel or job: the `%%gpujob` and `%gpujobs` magics, the widgets, the
program a cell job runs as, queued notebook execution and the GPU kernel's time-limit notice."""
