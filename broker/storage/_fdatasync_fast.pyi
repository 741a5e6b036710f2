from collections.abc import Sequence

FDS_MAX: int

class Job:
    @property
    def done(self) -> bool: ...
    @property
    def errors(self) -> tuple[int, ...]: ...

def submit(eventfd: int, fds: Sequence[int], /) -> Job: ...
