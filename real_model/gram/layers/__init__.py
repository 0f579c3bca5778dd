"""Per-module-type rules of the exact Gram, one file per type, registered by type.

``linear`` (``nn.Linear``), ``embedding`` (``nn.Embedding``; tied heads), ``leaf`` (any other
small leaf module, the fallback) with the closed forms of ``norm``; ``head``: an LM head
computed outside its module, in vocabulary tiles. The capture imports the rules (which
registers them); a new module type is one new file here with ``@register(ItsType)``.
"""
