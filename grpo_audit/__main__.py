"""``python -m grpo_audit``: same as the ``grpo-audit`` console script."""

from .cli import entry

if __name__ == "__main__":
    raise SystemExit(entry())
