"""The measuring tools: what a machine offers, what a model costs, and what a training step takes.

- :mod:`.env`: the environment report (``dit-env``): GPU, bf16/TF32, attention kernels, CPU, the profile;
- :mod:`.flops`: parameters and multiply-adds of the DiT configurations (``dit-models``);
- :mod:`.memory`: the memory planner (``dit-plan``) and the probes that check it;
- :mod:`.bench`: the fast-DiT ladder, sampling and optimizer timings (``dit-bench``).
"""
