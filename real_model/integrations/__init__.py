"""The hosts: TRL (:mod:`.trl`) and verl (:mod:`.verl`), thin, on one shared protocol.

The one geometry config (:mod:`.config`), the group record and the step's aggregate
(:mod:`.protocol`), the collectives (:mod:`.collectives`) and the per-step JSONL
(:mod:`.jsonl`) are shared; each host's folder adapts its trainer to them and imports the other
host never. Nothing outside this folder imports a host.
"""
