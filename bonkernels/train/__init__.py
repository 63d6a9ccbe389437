"""Reference training driver: ``python -m bonkernels.train --help``.

RL on verifiable rewards for real (tiny, or local) Hugging Face causal LMs with bonkernels'
advantages and policy loss; the embedded program-synthesis task and HumanEval (sandboxed);
checkpoints that resume exactly; data parallel under torchrun; pass@k / max@k evaluation.
"""
