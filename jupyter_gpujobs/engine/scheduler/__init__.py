"""The scheduler: one pure function, `schedule()`, from a snapshot to a `Plan`.

No I/O, no clock, no database: the service, the simulator and the tests call the same code.
The parts are small modules: priority (order), fairshare (decayed usage), quotas (limits and
guarantees), deferral (begin, off-peak, dependencies), placement (GPUs now and the time line
of reservations: backfill and expected starts), preemption (victims), planner (the cycle).
See docs/scheduling.md.
"""

from .fairshare import Usage, as_usage, decay_and_add, fairshare_factors
from .planner import schedule

__all__ = ["Usage", "as_usage", "decay_and_add", "fairshare_factors", "schedule"]
