"""Entry point of the frozen (PyInstaller) HalfSafe: the `halfsafe` command and the engine process.

A frozen build has no `python -m`: the GUI starts its engine as `<this executable> -m app.engine`,
so that form is recognised here and everything else goes to the `halfsafe` command.
"""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    if sys.argv[1:3] == ["-m", "app.engine"]:
        from app.engine.__main__ import main as engine_main

        raise SystemExit(engine_main(sys.argv[3:]))
    from app.cli import main

    raise SystemExit(main())
