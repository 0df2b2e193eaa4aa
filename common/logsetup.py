"""Structured logs in logfmt (key=value), one line per event, to stderr.

Written here rather than pulled from a library: it is a dozen lines, and logfmt is read
both by people tailing a journal and by Loki/Vector without configuration.
"""

from __future__ import annotations

import logging
import sys
import time

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _quote(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\n\\'):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class LogfmtFormatter(logging.Formatter):
    def __init__(self, static: dict[str, str]) -> None:
        super().__init__()
        self.static = static

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"ts={ts}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
        ]
        parts += [f"{k}={_quote(v)}" for k, v in self.static.items()]
        parts.append(f"msg={_quote(record.getMessage())}")
        parts += [f"{k}={_quote(v)}" for k, v in vars(record).items() if k not in _STANDARD]
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def configure(level: str, **static: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter({k: v for k, v in static.items() if v}))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    try:
        root.setLevel(level.upper())
    except ValueError:
        raise SystemExit(
            f"gpufleet: --log-level {level!r} is not one of debug, info, warning, error"
        ) from None
    logging.getLogger("grpc").setLevel(logging.WARNING)
