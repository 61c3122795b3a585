// What the cuDNN graphs (Cudnn.cpp's BF16 attention, CudnnFp8.cpp's FP8 attention) share: the
// enumerators of cudnn_graph.h they use and the builder of backend descriptors. Internal to
// backends/cuda/libraries.
#pragma once

#include "backends/cuda/libraries/Cudnn.h"

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

// Where the toolkit carries cuDNN's headers, the values below are checked against them.
#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define TGC_CHECK_CUDNN_VALUES 1
#endif

namespace tgc {

// The enumerators of cudnn_graph.h that the graphs below use (cuDNN 9's ABI).
namespace cudnn {
enum DataType : int { Float = 0, Half = 2, Int32 = 4, Bf16 = 9, Boolean = 11, Fp8E4M3 = 12, Fp8E5M2 = 13 };
enum AttributeType : int {
  TypeHandle = 0,
  TypeDataType = 1,
  TypeBoolean = 2,
  TypeInt64 = 3,
  TypeFloat = 4,
  TypeVoidPtr = 6,
  TypeHeurMode = 8,
  TypePointwiseMode = 14,
  TypeBackendDescriptor = 15,
  TypeReductionOperator = 18,
};
enum DescriptorType : int {
  PointwiseDescriptor = 0,
  EngineConfigDescriptor = 3,
  EngineHeuristicsDescriptor = 4,
  ExecutionPlanDescriptor = 5,
  OperationPointwiseDescriptor = 13,
  OperationGraphDescriptor = 15,
  VariantPackDescriptor = 16,
  TensorDescriptor = 17,
  MatmulDescriptor = 18,
  OperationMatmulDescriptor = 19,
  ReductionDescriptor = 21,
  OperationReductionDescriptor = 22,
  OperationReshapeDescriptor = 31,
};
enum Attribute : int {
  PointwiseMode = 0,
  PointwiseMathPrec = 1,
  PointwiseAxis = 9,
  EngineHeurMode = 200,
  EngineHeurOperationGraph = 201,
  EngineHeurResults = 202,
  ExecutionPlanHandle = 400,
  ExecutionPlanEngineConfig = 401,
  ExecutionPlanWorkspaceSize = 402,
  OperationPointwisePwDescriptor = 750,
  OperationPointwiseX = 751,
  OperationPointwiseB = 752,
  OperationPointwiseY = 753,
  OperationPointwiseAlpha1 = 754,
  OperationPointwiseAlpha2 = 755,
  OperationPointwiseT = 758,
  OperationGraphHandle = 800,
  OperationGraphOps = 801,
  TensorByteAlignment = 900,
  TensorDataType = 901,
  TensorDimensions = 902,
  TensorStrides = 903,
  TensorUniqueId = 906,
  TensorIsVirtual = 907,
  TensorIsByValue = 908,
  VariantPackUniqueIds = 1000,
  VariantPackDataPointers = 1001,
  VariantPackWorkspace = 1003,
  MatmulCompType = 1500,
  OperationMatmulA = 1520,
  OperationMatmulB = 1521,
  OperationMatmulC = 1522,
  OperationMatmulDesc = 1523,
  ReductionOperator = 1600,
  ReductionCompType = 1601,
  OperationReductionX = 1610,
  OperationReductionY = 1611,
  OperationReductionDesc = 1612,
  OperationReshapeX = 2200,
  OperationReshapeY = 2201,
};
enum Pointwise : int {
  Add = 0,
  Mul = 1,
  Div = 6,
  Sub = 9,
  Exp = 13,
  Log = 15,
  CmpGe = 303,
  GenIndex = 501,
  BinarySelect = 601,
};
enum Reduce : int { ReduceAdd = 0, ReduceMax = 3, ReduceAmax = 4 };
enum HeurMode : int { HeurModeA = 3 };
} // namespace cudnn

#ifdef TGC_CHECK_CUDNN_VALUES
static_assert(int(cudnn::Float) == int(CUDNN_DATA_FLOAT) && int(cudnn::Int32) == int(CUDNN_DATA_INT32) &&
              int(cudnn::Bf16) == int(CUDNN_DATA_BFLOAT16) && int(cudnn::Boolean) == int(CUDNN_DATA_BOOLEAN) &&
              int(cudnn::Half) == int(CUDNN_DATA_HALF) && int(cudnn::Fp8E4M3) == int(CUDNN_DATA_FP8_E4M3) &&
              int(cudnn::Fp8E5M2) == int(CUDNN_DATA_FP8_E5M2));
static_assert(int(cudnn::TypeHandle) == int(CUDNN_TYPE_HANDLE) && int(cudnn::TypeDataType) == int(CUDNN_TYPE_DATA_TYPE) &&
              int(cudnn::TypeBoolean) == int(CUDNN_TYPE_BOOLEAN) && int(cudnn::TypeInt64) == int(CUDNN_TYPE_INT64) &&
              int(cudnn::TypeFloat) == int(CUDNN_TYPE_FLOAT) && int(cudnn::TypeVoidPtr) == int(CUDNN_TYPE_VOID_PTR) &&
              int(cudnn::TypeHeurMode) == int(CUDNN_TYPE_HEUR_MODE) && int(cudnn::TypePointwiseMode) == int(CUDNN_TYPE_POINTWISE_MODE) &&
              int(cudnn::TypeBackendDescriptor) == int(CUDNN_TYPE_BACKEND_DESCRIPTOR) &&
              int(cudnn::TypeReductionOperator) == int(CUDNN_TYPE_REDUCTION_OPERATOR_TYPE));
static_assert(int(cudnn::PointwiseDescriptor) == int(CUDNN_BACKEND_POINTWISE_DESCRIPTOR) &&
              int(cudnn::EngineConfigDescriptor) == int(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) &&
              int(cudnn::EngineHeuristicsDescriptor) == int(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR) &&
              int(cudnn::ExecutionPlanDescriptor) == int(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) &&
              int(cudnn::OperationPointwiseDescriptor) == int(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR) &&
              int(cudnn::OperationGraphDescriptor) == int(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR) &&
              int(cudnn::VariantPackDescriptor) == int(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) &&
              int(cudnn::TensorDescriptor) == int(CUDNN_BACKEND_TENSOR_DESCRIPTOR) &&
              int(cudnn::MatmulDescriptor) == int(CUDNN_BACKEND_MATMUL_DESCRIPTOR) &&
              int(cudnn::OperationMatmulDescriptor) == int(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) &&
              int(cudnn::ReductionDescriptor) == int(CUDNN_BACKEND_REDUCTION_DESCRIPTOR) &&
              int(cudnn::OperationReductionDescriptor) == int(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR) &&
              int(cudnn::OperationReshapeDescriptor) == int(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR));
static_assert(int(cudnn::PointwiseMode) == int(CUDNN_ATTR_POINTWISE_MODE) &&
              int(cudnn::PointwiseMathPrec) == int(CUDNN_ATTR_POINTWISE_MATH_PREC) &&
              int(cudnn::PointwiseAxis) == int(CUDNN_ATTR_POINTWISE_AXIS) &&
              int(cudnn::EngineHeurMode) == int(CUDNN_ATTR_ENGINEHEUR_MODE) &&
              int(cudnn::EngineHeurOperationGraph) == int(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH) &&
              int(cudnn::EngineHeurResults) == int(CUDNN_ATTR_ENGINEHEUR_RESULTS) &&
              int(cudnn::ExecutionPlanEngineConfig) == int(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG) &&
              int(cudnn::ExecutionPlanWorkspaceSize) == int(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) &&
              int(cudnn::OperationPointwisePwDescriptor) == int(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR) &&
              int(cudnn::OperationPointwiseX) == int(CUDNN_ATTR_OPERATION_POINTWISE_XDESC) &&
              int(cudnn::OperationPointwiseB) == int(CUDNN_ATTR_OPERATION_POINTWISE_BDESC) &&
              int(cudnn::OperationPointwiseY) == int(CUDNN_ATTR_OPERATION_POINTWISE_YDESC) &&
              int(cudnn::OperationPointwiseAlpha1) == int(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1) &&
              int(cudnn::OperationPointwiseAlpha2) == int(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2) &&
              int(cudnn::OperationPointwiseT) == int(CUDNN_ATTR_OPERATION_POINTWISE_TDESC) &&
              int(cudnn::OperationGraphOps) == int(CUDNN_ATTR_OPERATIONGRAPH_OPS) &&
              int(cudnn::TensorByteAlignment) == int(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT) &&
              int(cudnn::TensorDataType) == int(CUDNN_ATTR_TENSOR_DATA_TYPE) &&
              int(cudnn::TensorDimensions) == int(CUDNN_ATTR_TENSOR_DIMENSIONS) &&
              int(cudnn::TensorStrides) == int(CUDNN_ATTR_TENSOR_STRIDES) &&
              int(cudnn::TensorUniqueId) == int(CUDNN_ATTR_TENSOR_UNIQUE_ID) &&
              int(cudnn::TensorIsVirtual) == int(CUDNN_ATTR_TENSOR_IS_VIRTUAL) &&
              int(cudnn::TensorIsByValue) == int(CUDNN_ATTR_TENSOR_IS_BY_VALUE) &&
              int(cudnn::VariantPackUniqueIds) == int(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS) &&
              int(cudnn::VariantPackDataPointers) == int(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS) &&
              int(cudnn::VariantPackWorkspace) == int(CUDNN_ATTR_VARIANT_PACK_WORKSPACE) &&
              int(cudnn::MatmulCompType) == int(CUDNN_ATTR_MATMUL_COMP_TYPE) &&
              int(cudnn::OperationMatmulA) == int(CUDNN_ATTR_OPERATION_MATMUL_ADESC) &&
              int(cudnn::OperationMatmulB) == int(CUDNN_ATTR_OPERATION_MATMUL_BDESC) &&
              int(cudnn::OperationMatmulC) == int(CUDNN_ATTR_OPERATION_MATMUL_CDESC) &&
              int(cudnn::OperationMatmulDesc) == int(CUDNN_ATTR_OPERATION_MATMUL_DESC) &&
              int(cudnn::ReductionOperator) == int(CUDNN_ATTR_REDUCTION_OPERATOR) &&
              int(cudnn::ReductionCompType) == int(CUDNN_ATTR_REDUCTION_COMP_TYPE) &&
              int(cudnn::OperationReductionX) == int(CUDNN_ATTR_OPERATION_REDUCTION_XDESC) &&
              int(cudnn::OperationReductionY) == int(CUDNN_ATTR_OPERATION_REDUCTION_YDESC) &&
              int(cudnn::OperationReductionDesc) == int(CUDNN_ATTR_OPERATION_REDUCTION_DESC) &&
              int(cudnn::OperationReshapeX) == int(CUDNN_ATTR_OPERATION_RESHAPE_XDESC) &&
              int(cudnn::OperationReshapeY) == int(CUDNN_ATTR_OPERATION_RESHAPE_YDESC));
static_assert(int(cudnn::Add) == int(CUDNN_POINTWISE_ADD) && int(cudnn::Mul) == int(CUDNN_POINTWISE_MUL) &&
              int(cudnn::Div) == int(CUDNN_POINTWISE_DIV) && int(cudnn::Sub) == int(CUDNN_POINTWISE_SUB) &&
              int(cudnn::Exp) == int(CUDNN_POINTWISE_EXP) && int(cudnn::Log) == int(CUDNN_POINTWISE_LOG) &&
              int(cudnn::CmpGe) == int(CUDNN_POINTWISE_CMP_GE) && int(cudnn::GenIndex) == int(CUDNN_POINTWISE_GEN_INDEX) &&
              int(cudnn::BinarySelect) == int(CUDNN_POINTWISE_BINARY_SELECT));
static_assert(int(cudnn::ReduceAdd) == int(CUDNN_REDUCE_TENSOR_ADD) && int(cudnn::ReduceMax) == int(CUDNN_REDUCE_TENSOR_MAX) &&
              int(cudnn::ReduceAmax) == int(CUDNN_REDUCE_TENSOR_AMAX) &&
              int(cudnn::HeurModeA) == int(CUDNN_HEUR_MODE_A));
#endif

using Dims = std::array<int64_t, 4>;

/// Strides of a row-major [d0][d1][d2][d3].
inline Dims packed(const Dims &d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

/// Builds descriptors, keeping each in `owned` (destroyed with the plan), and remembers the
/// first failure: the call, cuDNN's status and its last error message.
class GraphBuilder {
public:
  GraphBuilder(const CudnnApi &api, std::vector<void *> &owned) : api_(api), owned_(owned) {}

  bool failed() const { return !failure_.empty(); }
  const std::string &failure() const { return failure_; }

  void *create(int type, const char *what) {
    void *d = nullptr;
    if (failed() || !check(api_.createDescriptor(type, &d), what))
      return nullptr;
    owned_.push_back(d);
    return d;
  }
  void set(void *d, int name, int type, int64_t count, const void *elements, const char *what) {
    if (!failed() && d)
      check(api_.setAttribute(d, name, type, count, elements), what);
  }
  void setDescriptor(void *d, int name, void *value, const char *what) {
    set(d, name, cudnn::TypeBackendDescriptor, 1, &value, what);
  }
  void setInt(void *d, int name, int type, int value, const char *what) { set(d, name, type, 1, &value, what); }
  void finalize(void *d, const char *what) {
    if (!failed() && d)
      check(api_.finalize(d), what);
  }

  /// A tensor: non-virtual ones have the uid their pointer goes with in the variant pack.
  void *tensor(int64_t uid, int type, const Dims &dims, const Dims &strides, bool isVirtual, bool byValue = false) {
    void *t = create(cudnn::TensorDescriptor, "a tensor descriptor");
    int64_t alignment = 16;
    bool virt = isVirtual, value = byValue;
    setInt(t, cudnn::TensorDataType, cudnn::TypeDataType, type, "the tensor's data type");
    set(t, cudnn::TensorDimensions, cudnn::TypeInt64, 4, dims.data(), "the tensor's dimensions");
    set(t, cudnn::TensorStrides, cudnn::TypeInt64, 4, strides.data(), "the tensor's strides");
    set(t, cudnn::TensorUniqueId, cudnn::TypeInt64, 1, &uid, "the tensor's uid");
    set(t, cudnn::TensorByteAlignment, cudnn::TypeInt64, 1, &alignment, "the tensor's alignment");
    set(t, cudnn::TensorIsVirtual, cudnn::TypeBoolean, 1, &virt, "the tensor's virtual flag");
    if (byValue)
      set(t, cudnn::TensorIsByValue, cudnn::TypeBoolean, 1, &value, "the tensor's by-value flag");
    finalize(t, "a tensor descriptor");
    return t;
  }
  /// An intermediate of the graph (never in memory), fp32 unless said.
  void *intermediate(const Dims &dims, int type = cudnn::Float) {
    return tensor(nextVirtual_++, type, dims, packed(dims), /*isVirtual=*/true);
  }
  void *intermediate(const Dims &dims, const Dims &strides, int type) {
    return tensor(nextVirtual_++, type, dims, strides, /*isVirtual=*/true);
  }
  /// A scalar passed by value: [1, 1, 1, 1], its value a host pointer in the variant pack.
  void *scalar(int64_t uid) { return tensor(uid, cudnn::Float, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }
  /// An fp32 scalar in GPU memory (an FP8 scale, descale or amax): [1, 1, 1, 1].
  void *deviceScalar(int64_t uid) { return tensor(uid, cudnn::Float, {1, 1, 1, 1}, {1, 1, 1, 1}, false); }

  /// y = mode(x[, b[, t]]), computed in `math`.
  void pointwise(int mode, void *x, void *b, void *y, void *t = nullptr, int math = cudnn::Float, int64_t axis = -1) {
    void *pw = create(cudnn::PointwiseDescriptor, "a pointwise descriptor");
    setInt(pw, cudnn::PointwiseMode, cudnn::TypePointwiseMode, mode, "the pointwise mode");
    setInt(pw, cudnn::PointwiseMathPrec, cudnn::TypeDataType, math, "the pointwise precision");
    if (mode == cudnn::GenIndex)
      set(pw, cudnn::PointwiseAxis, cudnn::TypeInt64, 1, &axis, "the index's axis");
    finalize(pw, "a pointwise descriptor");
    void *op = create(cudnn::OperationPointwiseDescriptor, "a pointwise operation");
    setDescriptor(op, cudnn::OperationPointwisePwDescriptor, pw, "the pointwise operation's mode");
    setDescriptor(op, cudnn::OperationPointwiseX, x, "the pointwise operation's x");
    if (b)
      setDescriptor(op, cudnn::OperationPointwiseB, b, "the pointwise operation's b");
    if (t)
      setDescriptor(op, cudnn::OperationPointwiseT, t, "the pointwise operation's t");
    setDescriptor(op, cudnn::OperationPointwiseY, y, "the pointwise operation's y");
    float one = 1;
    set(op, cudnn::OperationPointwiseAlpha1, cudnn::TypeFloat, 1, &one, "the pointwise operation's alpha1");
    set(op, cudnn::OperationPointwiseAlpha2, cudnn::TypeFloat, 1, &one, "the pointwise operation's alpha2");
    add(op, "a pointwise operation");
  }
  /// c = a b (batched over the two leading dimensions), accumulated in fp32.
  void matmul(void *a, void *b, void *c) {
    void *mm = create(cudnn::MatmulDescriptor, "a matmul descriptor");
    setInt(mm, cudnn::MatmulCompType, cudnn::TypeDataType, cudnn::Float, "the matmul's precision");
    finalize(mm, "a matmul descriptor");
    void *op = create(cudnn::OperationMatmulDescriptor, "a matmul operation");
    setDescriptor(op, cudnn::OperationMatmulA, a, "the matmul's a");
    setDescriptor(op, cudnn::OperationMatmulB, b, "the matmul's b");
    setDescriptor(op, cudnn::OperationMatmulC, c, "the matmul's c");
    setDescriptor(op, cudnn::OperationMatmulDesc, mm, "the matmul's descriptor");
    add(op, "a matmul operation");
  }
  /// y = the sum or maximum of x over the dimensions where y has 1.
  void reduction(int reduce, void *x, void *y) {
    void *rd = create(cudnn::ReductionDescriptor, "a reduction descriptor");
    setInt(rd, cudnn::ReductionOperator, cudnn::TypeReductionOperator, reduce, "the reduction's operator");
    setInt(rd, cudnn::ReductionCompType, cudnn::TypeDataType, cudnn::Float, "the reduction's precision");
    finalize(rd, "a reduction descriptor");
    void *op = create(cudnn::OperationReductionDescriptor, "a reduction operation");
    setDescriptor(op, cudnn::OperationReductionDesc, rd, "the reduction's descriptor");
    setDescriptor(op, cudnn::OperationReductionX, x, "the reduction's x");
    setDescriptor(op, cudnn::OperationReductionY, y, "the reduction's y");
    add(op, "a reduction operation");
  }
  /// y = x seen through y's dimensions and strides (a transpose).
  void reshape(void *x, void *y) {
    void *op = create(cudnn::OperationReshapeDescriptor, "a reshape operation");
    setDescriptor(op, cudnn::OperationReshapeX, x, "the reshape's x");
    setDescriptor(op, cudnn::OperationReshapeY, y, "the reshape's y");
    add(op, "a reshape operation");
  }

  const std::vector<void *> &operations() const { return ops_; }

  /// Records a failed call; true when `status` is success.
  bool check(int status, const char *what) {
    if (status == 0)
      return true;
    if (failure_.empty())
      failure_ = fmt::format("{}: {}", what, api_.describe(status));
    return false;
  }

private:
  void add(void *op, const char *what) {
    finalize(op, what);
    if (!failed())
      ops_.push_back(op);
  }

  const CudnnApi &api_;
  std::vector<void *> &owned_;
  std::vector<void *> ops_;
  std::string failure_;
  int64_t nextVirtual_ = 100;
};

// The uids of the tensors run() takes, then those of the scalars.
enum Uid : int64_t {
  UidQ = 1,
  UidK,
  UidV,
  UidO,
  UidStats,
  UidDO,
  UidDQ,
  UidDK,
  UidDV,
  UidSoftmaxSum,
  UidScale,
  UidNegativeInfinity,
  UidOne,
  // FP8 attention's scales (the factor into FP8), descales (out of it) and amaxes.
  UidDescaleQ,
  UidDescaleK,
  UidDescaleV,
  UidDescaleS,
  UidDescaleO,
  UidDescaleDO,
  UidDescaleDP,
  UidScaleS,
  UidScaleO,
  UidScaleDP,
  UidScaleDQ,
  UidScaleDK,
  UidScaleDV,
  UidAmaxS,
  UidAmaxO,
  UidAmaxDP,
  UidAmaxDQ,
  UidAmaxDK,
  UidAmaxDV,
};

/// The causal mask of cudnn_frontend's diagonal band (right bound 0, top-left aligned): a score
/// stays where its row (query) is at or after its column (key), else -inf.
inline void *causalMask(GraphBuilder &g, void *scores, const Dims &dims, void *negativeInfinity) {
  void *row = g.intermediate(dims, cudnn::Int32), *column = g.intermediate(dims, cudnn::Int32);
  g.pointwise(cudnn::GenIndex, scores, nullptr, row, nullptr, cudnn::Int32, 2);
  g.pointwise(cudnn::GenIndex, scores, nullptr, column, nullptr, cudnn::Int32, 3);
  void *keep = g.intermediate(dims, cudnn::Boolean);
  g.pointwise(cudnn::CmpGe, row, column, keep, nullptr, cudnn::Boolean);
  void *masked = g.intermediate(dims);
  g.pointwise(cudnn::BinarySelect, scores, negativeInfinity, masked, keep);
  return masked;
}

/// What an attention's graph shares between its forward and its gradient: the shape, the
/// layouts of q, k, v, out and the statistics, and the tensors both graphs start from (q, k
/// transposed, out, the statistics, the scale, -inf, and the scaled scores).
struct AttentionLayout {
  int64_t T = 0, H = 0, DH = 0;
  Dims headDims, headStrides, rowDims, rowStrides, packedStrides, qkvStrides, transposedDims, transposedStrides;
  Dims kvDims, kvStrides; // k and v: [B][KV][T][DH] (grouped-query attention), else as q
  Dims statDims, statStrides, scoreDims;
  void *q = nullptr, *kT = nullptr, *out = nullptr, *stats = nullptr, *scale = nullptr, *negativeInfinity = nullptr;
  void *scaled = nullptr;
};

/// cudnn_frontend's softmax with statistics over the masked scores: max, exp, sum, the
/// statistics max + log(sum) into `stats`, and the probabilities (of `type`) returned.
inline void *softmaxWithStats(GraphBuilder &g, void *masked, const Dims &statDims, const Dims &scoreDims, void *stats,
                              int type) {
  void *max = g.intermediate(statDims), *shifted = g.intermediate(scoreDims), *exps = g.intermediate(scoreDims);
  g.reduction(cudnn::ReduceMax, masked, max);
  g.pointwise(cudnn::Sub, masked, max, shifted);
  g.pointwise(cudnn::Exp, shifted, nullptr, exps);
  void *sum = g.intermediate(statDims), *logSum = g.intermediate(statDims);
  g.reduction(cudnn::ReduceAdd, exps, sum);
  g.pointwise(cudnn::Log, sum, nullptr, logSum);
  g.pointwise(cudnn::Add, max, logSum, stats);
  void *probabilities = g.intermediate(scoreDims, packed(scoreDims), type);
  g.pointwise(cudnn::Div, exps, sum, probabilities);
  return probabilities;
}

/// FP8 attention's forward and gradient graphs (CudnnFp8.cpp), from the shared start: scores
/// scaled, q and k (transposed) in FP8. Their run() pointers after the BF16 graph's, in order
/// (the uids each takes): fp8ForwardUids, fp8BackwardUids.
void fp8ForwardGraph(GraphBuilder &g, const AttentionLayout &l, const CudnnAttentionShape &s);
void fp8BackwardGraph(GraphBuilder &g, const AttentionLayout &l, const CudnnAttentionShape &s);
std::vector<int64_t> fp8ForwardUids();
std::vector<int64_t> fp8BackwardUids();
/// cuDNN's data type for `t`.
int cudnnDataType(CudnnType t);

} // namespace tgc
