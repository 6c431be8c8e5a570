"""vLLM's engines as paired sides: paired.live's process protocol, started by the stack's one launcher
(launch.spawn), failures read from vLLM's log (logs.failure_reason_in) rather than its wrapper exceptions."""

from __future__ import annotations

from b70bench.paired.live import LiveProcess
from b70bench.stack import launch, logs


class StackProcess(LiveProcess):
    """A live process of the stack under test (decode.live's engines)."""

    spawn = staticmethod(launch.spawn)

    def reason(self) -> str | None:
        return logs.failure_reason_in(self.log_path)

    def explain(self, error: str) -> str:
        if not error or logs.is_wrapper(error):  # "Engine core initialization failed. See root cause above"
            return self.reason() or error or "no reason given"
        return error
