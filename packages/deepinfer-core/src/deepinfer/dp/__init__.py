"""Attention data parallelism with MoE expert parallelism: D rank processes, one engine each.

Rank 0 (the caller's process) runs the front end (:mod:`.frontend`): it routes requests to
ranks (:mod:`.balancer`) and steps every rank in lockstep (:mod:`.lockstep`), exchanging
commands and outputs with ``torch.distributed`` object collectives once per step
(:mod:`.protocol`, :mod:`.group`); no step runs before every rank has said it built its engine
(:mod:`.startup`). This package sits above the engine; the collectives inside
the MoE layers live below the models, in :mod:`deepinfer.parallel`.

Import from the modules themselves: this package's ``__init__`` stays empty so that the command
line can read :mod:`.options` without importing torch.
"""
