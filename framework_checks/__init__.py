"""framework_checks: TRL's, verl's and OpenRLHF's OWN advantage and loss code vs ``grpo_theory``.

Nothing here re-implements a framework. The framework's source is read (:mod:`.source`: the
installed package, an unpacked tree, one of its files, or a ``.whl``), the functions (or, for
TRL, the block of ``GRPOTrainer._generate_and_score_completions`` that turns rewards into
advantages) are taken out of it with :mod:`ast` and executed with the heavy imports replaced by
small stubs (:mod:`.extract`). The stubs only stand in for configuration objects and logging;
every arithmetic line that touches rewards, advantages or losses is the framework's own. One
module per framework (:mod:`.trl`, :mod:`.verl`, :mod:`.openrlhf`) builds its settings on the
one layout of :mod:`.adapter` (``rewards [P, R]``, ``lengths [P, R]`` -> per-sequence values);
:func:`.load.load_framework` picks the module.

The audit (:mod:`.audit`) runs every setting on a fixed battery (:mod:`.battery`) against the
``grpo_theory`` function the conventions map it to (:mod:`.ours`) and :mod:`.report` renders it;
``grpo-audit frameworks`` (:mod:`.cli`) prints and writes it.

Versions read: TRL 1.16.0 (``trl/trainer/grpo_trainer.py``, ``rloo_trainer.py``, ``utils.py``),
verl 0.9.1 (``verl/trainer/ppo/core_algos.py``, ``verl/utils/torch_functional.py``), OpenRLHF
0.11.2 (``openrlhf/trainer/ppo_utils/experience_maker.py``, ``openrlhf/models/loss.py``,
``openrlhf/models/utils.py``). Other versions load if the same names exist; the anchors are
checked and a clear error names what is missing.

Importing this package is cheap (no numpy, no torch).
"""
