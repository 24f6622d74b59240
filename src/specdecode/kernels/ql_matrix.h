// A packed matrix as numbers: a table's rows in fp32 (an embedding kept packed) and the fp64 reference product.
// Part of quant_linear.cpp's one translation unit (included there after format_of and check_packed; never alone).
#pragma once

namespace {

// fp32 rows ``ids`` of the [N, K] matrix a packed weight stands for, bit for bit kernels/quant.py's ``dequantize``:
// a table kept packed, looked up (an embedding: a row or a few a step, where decoding their 16-row groups in torch
// cost ~0.36 ms of Gemma 3 270M's 11 ms step)
at::Tensor dequantize_rows(const at::Tensor& w, const at::Tensor& ids, int64_t K) {
  const int fmt = format_of(w);
  check_packed("dequantize_rows", w, fmt, K);
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "dequantize_rows: ids must be a 1-D int64 tensor");
  const at::Tensor idc = ids.contiguous();
  const int64_t N = w.size(0), R = idc.numel();
  const int64_t* ip = idc.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r)
    TORCH_CHECK(ip[r] >= 0 && ip[r] < N, "dequantize_rows: row ", ip[r], " outside the matrix's ", N, " rows");
  const Layout L(fmt, N, K);
  at::Tensor y = at::empty({R, K}, at::TensorOptions().dtype(at::kFloat));
  float* yp = y.data_ptr<float>();
  const uint8_t* wp = reinterpret_cast<const uint8_t*>(w.data_ptr());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) yp[r * K + k] = L.weight(wp, ip[r], k);
  return y;
}

// Reference: the same quantized activations and weights, dequantized, multiplied in fp64 (tests).
at::Tensor reference(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "reference: fp32 [M, K] x");
  const int fmt = format_of(w);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  check_packed("reference", w, fmt, K);
  const Layout L(fmt, N, K);
  QX qx;
  quantize_x(fmt, x.data_ptr<float>(), M, K, qx);
  at::Tensor y = at::zeros({M, N}, x.options().dtype(at::kDouble));
  double* yp = y.data_ptr<double>();
  const uint8_t* wp = reinterpret_cast<const uint8_t*>(w.data_ptr());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0;
      if (k4_fmt(fmt)) {  // the dequantized weight d * sc * v - dmin * m (exact in fp64)
        for (int64_t k = 0; k < qx.Kp; ++k) {
          float ds, dm;
          L.q4k_scales(wp, n, k / 32, ds, dm);
          acc += (double(ds) * L.q4k_v(wp, n, k) - double(dm)) * double(qx.d[m * qx.nb + k / 32]) * qx.q[m * qx.Kp + k];
        }
        yp[m * N + n] = acc;
        continue;
      }
      if (b32_fmt(fmt)) {  // the dequantized weight d * (q - 16) (q5_0) or d * q + m (q4_1, q5_1), exact in fp64
        for (int64_t k = 0; k < qx.Kp; ++k) {
          const double d = half_to_float(L.b32_half(wp, n, k / 32, false)), q = L.b32_q(wp, n, k);
          const double wv = b32_min(fmt) ? d * q + double(half_to_float(L.b32_half(wp, n, k / 32, true))) : d * (q - 16);
          acc += wv * double(qx.d[m * qx.nb + k / 32]) * qx.q[m * qx.Kp + k];
        }
        yp[m * N + n] = acc;
        continue;
      }
      if (fmt == FMT_Q6K) {  // the dequantized weight (d * sc) * (q - 32) (exact in fp64)
        for (int64_t k = 0; k < qx.Kp; ++k)
          acc += double(L.q6k_ds(wp, n, k / 16)) * (L.q6k_q(wp, n, k) - 32) * double(qx.d[m * qx.nb + k / 32]) *
                 qx.q[m * qx.Kp + k];
        yp[m * N + n] = acc;
        continue;
      }
      for (int64_t k = 0; k < qx.Kp; ++k)
        acc += double(half_to_float(L.scale(wp, n, k / 32))) * L.wq(wp, n, k) * double(qx.d[m * qx.nb + k / 32]) *
               qx.q[m * qx.Kp + k];
      yp[m * N + n] = acc;
    }
  return y;
}

}  // namespace
