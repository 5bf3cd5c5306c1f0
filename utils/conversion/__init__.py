"""Lesson 04, model conversion and graph optimization: ONNX graphs and their optimization, quantization, graph
surgery (onnx_tools), graphs drawn as SVG offline (graph_svg), and TensorRT (trt). Exporting a model and opening an
ONNX Runtime session are shared with lessons 01 and 05 and live in utils.core.onnx_io.
"""
