"""The benchmarks' library: one model loader (:mod:`.models`), one gloo launcher (:mod:`.gloo`),
one train-step timer (:mod:`.timing`) and the one-device equivalence check (:mod:`.equivalence`).

Import the module you need (``from benchmarks.common.gloo import spawn``): nothing is re-exported
here, so that loading a model spec does not import torch.distributed.
"""
