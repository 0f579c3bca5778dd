"""Claim packages of the papers audited besides the seed paper (one sub-package per paper)."""
