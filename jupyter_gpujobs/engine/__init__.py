"""Everything the engine process runs: the job service and its loops, the pure scheduler, the
store, the runners and their job supervisors, the GPU backends, the monitor and the REST API.

The engine is hosted either inside a user's Jupyter server (the personal deployment) or as the
machine's one shared engine (`jupyter gpujobs engine`); the code is the same.

No imports here: every job's supervisor imports this package on start-up.
"""
