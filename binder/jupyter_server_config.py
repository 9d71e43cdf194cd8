# Binder has no GPUs: schedule jobs on fake ones (they get CUDA_VISIBLE_DEVICES like real ones).
# postBuild copies this file into the Jupyter config dir.
c = get_config()  # noqa: F821
c.GPUJobs.fake_gpus = "2xA100-80GB,2xT4"
c.GPUJobs.default_time_limit = "10m"
c.GPUJobs.max_time_limit = "1h"
