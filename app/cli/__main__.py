"""`python -m app.cli`: the same as the `halfsafe` command."""

from app.cli import main

raise SystemExit(main())
