"""GPU memory of DiT training: predicted from the model's structure, checked against what PyTorch holds.

- :mod:`.estimator`: the prediction. Weights, gradients, optimizer state, EMA and the activations that each
  DiT block saves for backward (:data:`~.estimator.BLOCK_SAVED`, read off the forward pass op by op), at the
  moments of a step where the peak can fall (:func:`~.estimator.estimate`);
- :mod:`.planner`: the micro-batch, accumulation and checkpointed blocks that fit a card
  (:func:`~.planner.plan`, ``dit-plan``), and the low-memory options with their speed costs;
- :mod:`.probes`: the measurements that check it: the bytes autograd saves, and every tensor a step
  allocates and frees (:class:`~.probes.TensorMemoryTracker`, on the CPU or the ``meta`` device).

With the VAE encoder in the loop, the estimate counts the encoder's weights and tensors
(:func:`~.estimator.vae_encode_bytes`), not the convolution workspace cuDNN takes on a GPU, which grows with the
free memory: there it is the tensors' share of the peak, not a bound (chapter 06 shows the measured figures).
"""

from .estimator import (
    ATTENTION,
    BLOCK_SAVED,
    EMA_PLACES,
    GIB,
    OPTIMIZERS,
    PRECISIONS,
    SD_VAE,
    VAE_PARAMS,
    ActivationEstimate,
    MemoryEstimate,
    ModelShape,
    TrainSetup,
    VaeShape,
    activation_bytes,
    block_saved_table,
    check_planned,
    estimate,
    format_bytes,
    optimizer_state_bytes,
    param_counts,
    relative_error,
    vae_encode_bytes,
)
from .planner import (
    GPU_MEMORY_GIB,
    Plan,
    card_budget,
    config_setup,
    fitting_plan,
    low_memory_options,
    parse_memory,
    plan,
    relative_step_time,
    train_command,
)
from .probes import (
    TensorMemoryTracker,
    measure_saved_bytes,
    measure_saved_per_sample,
    optimizer_tensors,
    simulate_peak,
    tensor_bytes,
)

__all__ = [
    "ATTENTION", "BLOCK_SAVED", "EMA_PLACES", "GIB", "OPTIMIZERS", "PRECISIONS", "SD_VAE", "VAE_PARAMS",
    "ActivationEstimate", "MemoryEstimate", "ModelShape", "TrainSetup", "VaeShape", "activation_bytes",
    "block_saved_table", "check_planned", "estimate", "format_bytes", "optimizer_state_bytes", "param_counts",
    "relative_error", "vae_encode_bytes", "GPU_MEMORY_GIB",
    "Plan", "card_budget", "config_setup", "fitting_plan", "low_memory_options", "parse_memory", "plan",
    "relative_step_time", "train_command", "TensorMemoryTracker",
    "measure_saved_bytes", "measure_saved_per_sample", "optimizer_tensors", "simulate_peak", "tensor_bytes",
]
