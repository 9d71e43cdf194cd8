"""jupyter-gpujobs: a GPU job queue and fair scheduler for shared GPU servers, inside Jupyter.

This module holds the entry points Jupyter looks for: the server extension, the prebuilt
labextension and the IPython extension (`%load_ext jupyter_gpujobs`).
"""


# No imports here, not even typing: every job's supervisor imports this package on start-up.

__version__ = "0.1.0"


def _jupyter_server_extension_points() -> list[dict[str, object]]:
    from .jupyter.extension import GPUJobsApp

    return [{"module": "jupyter_gpujobs.jupyter.extension", "app": GPUJobsApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-gpujobs"}]


def load_ipython_extension(ipython: object) -> None:
    from .notebook.magics import load_ipython_extension as load

    load(ipython)
