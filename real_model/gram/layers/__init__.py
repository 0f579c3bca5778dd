"""Per-module-type rules of the exact Gram, one file per type, registered by type.

``linear`` (``nn.Linear``), ``embedding`` (``nn.Embedding``; tied heads), ``leaf`` (any other
small leaf module, the fallback; norms by the closed forms of :mod:`..norms`); ``head`` and
``fused_head``: an LM head computed outside its module, in vocabulary tiles (the tiled head's,
or a host's fused kernel's). The capture imports the rules, which registers them
(:mod:`..registry`); a new module type is one new file here with ``@register(ItsType)``.
"""
