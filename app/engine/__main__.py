"""`python -m app.engine`: the engine process, speaking framed messages on stdin/stdout.

The real stdout is kept for the protocol and file descriptor 1 is pointed at stderr, so a stray
print() in any library lands in the engine log instead of corrupting the message stream.
`--handlers MODULE` adds or replaces jobs with MODULE.HANDLERS (request class -> handler; its
request records may cross the pipe; used to extend the engine);
`--heartbeat SECONDS` sets the interval of the heartbeat the GUI watches for (tests shorten it).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import os
import sys
import threading

from app.core.memory import free_large_blocks_promptly
from app.engine.events import (
    HEARTBEAT_S,
    ProtocolError,
    StrayFrame,
    allow_records_from,
    read_message,
    write_message,
)
from app.engine.jobs import HANDLERS
from app.engine.server import Engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.engine")
    parser.add_argument("--handlers", metavar="MODULE", action="append", default=[])
    parser.add_argument("--heartbeat", metavar="SECONDS", type=float, default=HEARTBEAT_S)
    args = parser.parse_args(argv)

    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    protocol_in = sys.stdin.buffer
    faulthandler.enable(sys.stderr)
    free_large_blocks_promptly()  # a job's tensors leave no resident holes behind

    handlers = dict(HANDLERS)
    for module_name in args.handlers:
        handlers.update(importlib.import_module(module_name).HANDLERS)
        allow_records_from(module_name)  # its job requests cross the pipe as HalfSafe's do

    engine = Engine(lambda event: write_message(protocol_out, event), handlers)

    def listen() -> None:
        try:
            while True:
                try:
                    message = read_message(protocol_in)
                except StrayFrame as error:  # the stream is in step: answer, read on
                    engine.refuse_frame(str(error))
                    continue
                if message is None:
                    break
                engine.receive(message)
        except (ProtocolError, OSError) as error:
            print(f"engine: request stream broken: {error}", file=sys.stderr)
        # The GUI is gone (or asked us to stop): never outlive it.
        engine.stop()

    threading.Thread(target=listen, name="engine-listener", daemon=True).start()
    engine.beat(args.heartbeat)
    # The GUI went away mid-job: nobody is left to tell.
    with contextlib.suppress(BrokenPipeError):
        engine.serve()
    print(f"engine {os.getpid()}: stopped", file=sys.stderr)
    sys.stderr.flush()
    # Skip interpreter teardown: CUDA and native threads can hang it, and there is nothing to save.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
