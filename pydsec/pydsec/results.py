"""Result types returned by the SDK."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


def _short(text: str, limit: int = 60) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"...(+{len(text) - limit} chars)"


@dataclass
class ExecResult:
    """What a command did. A command that hit its timeout has ``timed_out=True`` (and exit_code 137)."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0
    signal: int = 0
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], stdout: str | None = None, stderr: str | None = None) -> "ExecResult":
        return cls(
            exit_code=int(doc.get("exit_code", -1)),
            stdout=stdout if stdout is not None else str(doc.get("stdout") or ""),
            stderr=stderr if stderr is not None else str(doc.get("stderr") or ""),
            timed_out=bool(doc.get("timed_out", False)),
            truncated=bool(doc.get("truncated", False)),
            duration=float(doc.get("duration") or 0.0),
            signal=int(doc.get("signal") or 0),
            oom_killed=bool(doc.get("oom_killed", False)),
        )

    def __repr__(self) -> str:
        flags = "".join(f", {name}=True" for name in ("timed_out", "truncated", "oom_killed") if getattr(self, name))
        sig = f", signal={self.signal}" if self.signal else ""
        return (f"ExecResult(exit_code={self.exit_code}{sig}{flags}, duration={self.duration:.3f}, "
                f"stdout={_short(self.stdout)}, stderr={_short(self.stderr)})")
