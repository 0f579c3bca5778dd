"""Claims of arXiv 2606.29238 registered for issue 11: the abstract's "conditions under which
GRPO's baseline is optimal", the metric definitions of Sec. 7.1 and the algebra steps of App. A.3
(Eqs. 26 and 27).
"""

from __future__ import annotations
