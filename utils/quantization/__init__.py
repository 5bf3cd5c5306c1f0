"""Quantization from the arithmetic up (lesson 04, part 3: notebooks/04_quantization.ipynb).

One module per concern, each using utils.core (and calibrate, part 1's utils.conversion.onnx_tools: the same
lesson's layer):

- ``affine``: the affine mapping (scale, zero point, clipping), quantize / dequantize, the integer matmul with int32
  accumulation and requantization, fake quantization with a straight-through estimator;
- ``digits``: the small model the calibration and QAT sections share (an MLP on scikit-learn's bundled digits);
- ``calibrate``: activation ranges from ONNX Runtime's calibrators (min-max, percentile, entropy);
- ``qat``: post-training quantization against quantization-aware training with fake-quantized linear layers;
- ``weights``: weight-only group-wise 4-bit quantization (round-to-nearest, GPTQ-style error feedback, AWQ-style
  activation-aware scaling), int4 packing, and SmoothQuant's scale migration for W8A8.
"""
