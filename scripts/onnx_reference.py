#!/usr/bin/env python3
"""Reference outputs from Python onnxruntime (the same onnxruntime==1.31.1 wheel the backend loads).

usage: onnx_reference.py MODEL.onnx INPUT.bin SHAPE DTYPE OUTPUT.bin
  INPUT.bin: raw little-endian tensor of SHAPE (comma separated, batch first) and DTYPE (numpy
  name, e.g. float32); runs the model's first input -> first output on the CPU provider with one
  thread and writes the raw output to OUTPUT.bin. Used by backend/tests/onnx.rs.
"""
import sys

import numpy as np
import onnxruntime as ort

model, inp, shape, dtype, out = sys.argv[1:6]
x = np.fromfile(inp, dtype=dtype).reshape([int(d) for d in shape.split(",")])
so = ort.SessionOptions()
so.intra_op_num_threads = 1
so.inter_op_num_threads = 1
s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
y = s.run([s.get_outputs()[0].name], {s.get_inputs()[0].name: x})[0]
np.ascontiguousarray(y).tofile(out)
