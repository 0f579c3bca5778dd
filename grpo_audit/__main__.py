"""``python -m grpo_audit``: same as the ``grpo-audit`` console script."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
