#include "backends/cuda/libraries/Cudnn.h"

#include "backends/cuda/libraries/Libraries.h"
#include "support/Error.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <limits>

// Where the toolkit carries cuDNN's headers, the values below are checked against them.
#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define TGC_CHECK_CUDNN_VALUES 1
#endif

namespace tgc {

namespace {

constexpr const char *kLibrary = "libcudnn.so.9", *kEnvironment = "TGC_CUDNN_LIBRARY";

// The enumerators of cudnn_graph.h that the graphs below use (cuDNN 9's ABI).
namespace cudnn {
enum DataType : int { Float = 0, Int32 = 4, Bf16 = 9, Boolean = 11 };
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
enum Reduce : int { ReduceAdd = 0, ReduceMax = 3 };
enum HeurMode : int { HeurModeA = 3 };
} // namespace cudnn

#ifdef TGC_CHECK_CUDNN_VALUES
static_assert(int(cudnn::Float) == int(CUDNN_DATA_FLOAT) && int(cudnn::Int32) == int(CUDNN_DATA_INT32) &&
              int(cudnn::Bf16) == int(CUDNN_DATA_BFLOAT16) && int(cudnn::Boolean) == int(CUDNN_DATA_BOOLEAN));
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
              int(cudnn::HeurModeA) == int(CUDNN_HEUR_MODE_A));
#endif

using Dims = std::array<int64_t, 4>;

/// Strides of a row-major [d0][d1][d2][d3].
Dims packed(const Dims &d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

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
};

/// The causal mask of cudnn_frontend's diagonal band (right bound 0, top-left aligned): a score
/// stays where its row (query) is at or after its column (key), else -inf.
void *causalMask(GraphBuilder &g, void *scores, const Dims &dims, void *negativeInfinity) {
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

void forwardGraph(GraphBuilder &g, const AttentionLayout &l) {
  const Dims &statDims = l.statDims, &scoreDims = l.scoreDims;
  void *out = l.out, *stats = l.stats, *negativeInfinity = l.negativeInfinity, *scaled = l.scaled;
  // cudnn_frontend's SDPA forward: scores, scale, causal mask, softmax (max, exp, sum; the
  // statistics max + log(sum)), probabilities in BF16 times v.
  void *v = g.tensor(UidV, cudnn::Bf16, l.kvDims, l.kvStrides, false);
  void *masked = causalMask(g, scaled, scoreDims, negativeInfinity);
  void *max = g.intermediate(statDims), *shifted = g.intermediate(scoreDims), *exps = g.intermediate(scoreDims);
  g.reduction(cudnn::ReduceMax, masked, max);
  g.pointwise(cudnn::Sub, masked, max, shifted);
  g.pointwise(cudnn::Exp, shifted, nullptr, exps);
  void *sum = g.intermediate(statDims), *logSum = g.intermediate(statDims);
  g.reduction(cudnn::ReduceAdd, exps, sum);
  g.pointwise(cudnn::Log, sum, nullptr, logSum);
  g.pointwise(cudnn::Add, max, logSum, stats);
  void *probabilities = g.intermediate(scoreDims, packed(scoreDims), cudnn::Bf16);
  g.pointwise(cudnn::Div, exps, sum, probabilities);
  g.matmul(probabilities, v, out);
}

void backwardGraph(GraphBuilder &g, const AttentionLayout &l, bool doutRows) {
  const Dims &headDims = l.headDims, &headStrides = l.headStrides, &rowDims = l.rowDims, &rowStrides = l.rowStrides;
  const Dims &packedStrides = l.packedStrides, &transposedDims = l.transposedDims;
  const Dims &transposedStrides = l.transposedStrides, &statDims = l.statDims, &statStrides = l.statStrides;
  const Dims &scoreDims = l.scoreDims;
  const int64_t H = l.H, T = l.T, DH = l.DH;
  void *q = l.q, *kT = l.kT, *out = l.out, *stats = l.stats, *scale = l.scale;
  void *negativeInfinity = l.negativeInfinity, *scaled = l.scaled;
  // cudnn_frontend's SDPA backward without dropout or bias, deterministic (dq straight from its
  // product): sum(dout * out) per query; the probabilities again from the statistics; dv =
  // P^T dout; dS = P (dout v^T - sum) * scale; dk = dS^T q; dq = dS k.
  void *vT = g.tensor(UidV, cudnn::Bf16, transposedDims, transposedStrides, false);
  void *dout = g.tensor(UidDO, cudnn::Bf16, headDims, doutRows ? rowStrides : headStrides, false);
  void *dq = g.tensor(UidDQ, cudnn::Bf16, rowDims, packedStrides, false);
  void *dk = g.tensor(UidDK, cudnn::Bf16, l.kvDims, packedStrides, false); // in dqkv's rows too
  void *dv = g.tensor(UidDV, cudnn::Bf16, l.kvDims, packedStrides, false);
  // Grouped-query attention: each query head's dk and dv are virtual BF16 intermediates
  // [B][H][T][DH], summed over a KV head's G query heads by a reduction into dk and dv (how
  // cudnn_frontend builds it for dense layouts; no full-head buffer in memory).
  bool grouped = l.kvDims[1] != H;
  auto fullHead = [&](void *kvGrad) { return grouped ? g.intermediate(headDims, headStrides, cudnn::Bf16) : kvGrad; };
  void *dkFull = fullHead(dk), *dvFull = fullHead(dv);
  void *softmaxSum = g.tensor(UidSoftmaxSum, cudnn::Float, statDims, statStrides, false);
  void *one = g.scalar(UidOne);
  void *products = g.intermediate(rowDims, {H * T * DH, T * DH, H * DH, 1}, cudnn::Float);
  void *rowSums = g.intermediate(statDims);
  g.pointwise(cudnn::Mul, dout, out, products);
  g.reduction(cudnn::ReduceAdd, products, rowSums);
  g.pointwise(cudnn::Mul, rowSums, one, softmaxSum);
  void *centered = g.intermediate(scoreDims);
  g.pointwise(cudnn::Sub, scaled, stats, centered);
  void *masked = causalMask(g, centered, scoreDims, negativeInfinity);
  void *probabilities = g.intermediate(scoreDims);
  g.pointwise(cudnn::Exp, masked, nullptr, probabilities);
  Dims transposedScores = {H * T * T, T * T, 1, T};
  void *probabilitiesT = g.intermediate(scoreDims, transposedScores, cudnn::Bf16);
  g.reshape(probabilities, probabilitiesT);
  g.matmul(probabilitiesT, dout, dvFull);
  if (grouped)
    g.reduction(cudnn::ReduceAdd, dvFull, dv);
  void *dP = g.intermediate(scoreDims), *dPCentered = g.intermediate(scoreDims);
  g.matmul(dout, vT, dP);
  g.pointwise(cudnn::Sub, dP, softmaxSum, dPCentered);
  void *dScores = g.intermediate(scoreDims), *dScaled = g.intermediate(scoreDims);
  g.pointwise(cudnn::Mul, dPCentered, probabilities, dScores);
  g.pointwise(cudnn::Mul, dScores, scale, dScaled);
  void *dScaledT = g.intermediate(scoreDims, transposedScores, cudnn::Bf16);
  g.reshape(dScaled, dScaledT);
  g.matmul(dScaledT, q, dkFull);
  if (grouped)
    g.reduction(cudnn::ReduceAdd, dkFull, dk);
  void *k = g.intermediate(l.kvDims, l.kvStrides, cudnn::Bf16);
  g.reshape(kT, k);
  g.matmul(dScaled, k, dq);
}

} // namespace

std::string CudnnApi::versionText() const { return versionFromCode(version); } // CUDNN_VERSION

std::string CudnnApi::describe(int status) const {
  char message[512] = {0};
  if (lastErrorString)
    lastErrorString(message, sizeof(message));
  return fmt::format("{} ({}){}{}", errorString ? errorString(status) : "", status, message[0] ? ": " : "", message);
}

std::vector<std::string> cudnnCandidates() { return libraryCandidates(kEnvironment, "cudnn", kLibrary); }

llvm::Expected<CudnnApi> loadCudnnFrom(const std::vector<std::string> &candidates) {
  auto api = openLibrary<CudnnApi>("cuDNN", kLibrary, kEnvironment, candidates, [](void *library, CudnnApi &api) {
    SymbolBinder need(library);
    need("cudnnGetVersion", api.getVersion);
    need("cudnnCreate", api.create);
    need("cudnnDestroy", api.destroy);
    need("cudnnSetStream", api.setStream);
    need("cudnnGetErrorString", api.errorString);
    need("cudnnGetLastErrorString", api.lastErrorString);
    need("cudnnBackendCreateDescriptor", api.createDescriptor);
    need("cudnnBackendDestroyDescriptor", api.destroyDescriptor);
    need("cudnnBackendFinalize", api.finalize);
    need("cudnnBackendSetAttribute", api.setAttribute);
    need("cudnnBackendGetAttribute", api.getAttribute);
    need("cudnnBackendExecute", api.execute);
    if (need.missing())
      return fmt::format("not cuDNN 9: no {}", need.missing());
    api.version = api.getVersion(); // needs no GPU
    if (api.version < 90000 || api.version >= 100000)
      return fmt::format("cuDNN {}: cuDNN 9 is needed", api.versionText());
    return std::string();
  });
  if (!api)
    return api.takeError();
  // cuDNN 9 opens its sub-libraries by name when first used; where they lie beside this one
  // (PyTorch's wheel, not on the loader's path), they are loaded from there first, so that
  // those names find them.
  if (size_t slash = api->path.rfind('/'); slash != std::string::npos)
    for (const char *part : {"libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9",
                             "libcudnn_engines_runtime_compiled.so.9", "libcudnn_heuristic.so.9"})
      dlopen((api->path.substr(0, slash + 1) + part).c_str(), RTLD_LAZY | RTLD_GLOBAL); // absent: no matter
  return api;
}

llvm::Expected<const CudnnApi *> loadCudnn() {
  return loadOnce<CudnnApi>([] { return loadCudnnFrom(cudnnCandidates()); });
}

std::string CudnnAttentionShape::key() const {
  return fmt::format("{} B {} T {} H {}{} DH {} scale {}{}{}", backward ? "backward" : "forward", B, T, H,
                     KV && KV != H ? fmt::format(" KV {}", KV) : "", DH, scale, qkvRows ? " qkv rows" : "",
                     doutRows ? " dout rows" : "");
}

llvm::Expected<std::unique_ptr<CudnnAttention>> CudnnAttention::create(const CudnnApi &api, void *handle,
                                                                       const CudnnAttentionShape &s, int only) {
  std::unique_ptr<CudnnAttention> a(new CudnnAttention(api, s));
  a->scalars_.scale = float(s.scale);
  a->scalars_.negativeInfinity = -std::numeric_limits<float>::infinity();
  GraphBuilder g(api, a->descriptors_);
  const int64_t B = s.B, T = s.T, H = s.H, DH = s.DH, D = H * DH;
  // q, k, v head-major ([3][B][H][T][DH]) or rows of the packed qkv ([B][T][3][H][DH]), each
  // [B][H][T][DH] by its strides. cuDNN's first product takes k transposed ([B][H][DH][T], the
  // same memory) and the gradient v too.
  Dims headDims = {B, H, T, DH}, headStrides = packed(headDims);
  Dims rowDims = {B, H, T, DH}, rowStrides = {T * D, DH, D, 1};          // out: [B][T][H * DH]
  // Grouped-query attention: k and v of KV heads, head-major; dqkv's rows (H + 2 KV) DH wide.
  const int64_t KV = s.KV ? s.KV : H, W = D + 2 * KV * DH;
  Dims packedStrides = {T * W, DH, W, 1}; // dq, dk, dv: rows of dqkv
  Dims qkvStrides = s.qkvRows ? packedStrides : headStrides;
  Dims kvDims = {B, KV, T, DH}, kvStrides = KV == H ? qkvStrides : packed(kvDims);
  Dims transposedDims = {B, KV, DH, T},
       transposedStrides = {kvStrides[0], kvStrides[1], kvStrides[3], kvStrides[2]};
  Dims statDims = {B, H, T, 1}, statStrides = {H * T, T, 1, 1};
  Dims scoreDims = {B, H, T, T};
  void *q = g.tensor(UidQ, cudnn::Bf16, headDims, qkvStrides, false);
  void *kT = g.tensor(UidK, cudnn::Bf16, transposedDims, transposedStrides, false);
  void *out = g.tensor(UidO, cudnn::Bf16, rowDims, rowStrides, false);
  void *stats = g.tensor(UidStats, cudnn::Float, statDims, statStrides, false);
  void *scale = g.scalar(UidScale), *negativeInfinity = g.scalar(UidNegativeInfinity);
  void *scores = g.intermediate(scoreDims), *scaled = g.intermediate(scoreDims);
  g.matmul(q, kT, scores);
  g.pointwise(cudnn::Mul, scores, scale, scaled);
  AttentionLayout l{T, H, DH, headDims, headStrides, rowDims, rowStrides, packedStrides, qkvStrides,
                    transposedDims, transposedStrides, kvDims, kvStrides, statDims, statStrides, scoreDims,
                    q, kT, out, stats, scale, negativeInfinity, scaled};
  if (!s.backward) {
    forwardGraph(g, l);
    a->uids_ = {UidQ, UidK, UidV, UidO, UidStats};
  } else {
    backwardGraph(g, l, s.doutRows);
    a->uids_ = {UidQ, UidK, UidV, UidO, UidDO, UidStats, UidDQ, UidDK, UidDV, UidSoftmaxSum};
  }
  a->uids_.push_back(UidScale);
  a->uids_.push_back(UidNegativeInfinity);
  if (s.backward)
    a->uids_.push_back(UidOne);

  // The operation graph and cuDNN's heuristic's choices (mode A).
  void *graph = g.create(cudnn::OperationGraphDescriptor, "the operation graph");
  g.set(graph, cudnn::OperationGraphHandle, cudnn::TypeHandle, 1, &handle, "the graph's handle");
  g.set(graph, cudnn::OperationGraphOps, cudnn::TypeBackendDescriptor, int64_t(g.operations().size()),
        g.operations().data(), "the graph's operations");
  g.finalize(graph, "the operation graph");
  void *heuristics = g.create(cudnn::EngineHeuristicsDescriptor, "the engine heuristics");
  g.setDescriptor(heuristics, cudnn::EngineHeurOperationGraph, graph, "the heuristics' graph");
  g.setInt(heuristics, cudnn::EngineHeurMode, cudnn::TypeHeurMode, cudnn::HeurModeA, "the heuristics' mode");
  g.finalize(heuristics, "the engine heuristics");
  int64_t count = 0;
  if (!g.failed())
    g.check(api.getAttribute(heuristics, cudnn::EngineHeurResults, cudnn::TypeBackendDescriptor, 0, &count, nullptr),
            "the number of engine configurations");
  std::vector<void *> configs;
  for (int64_t i = 0; i < count && !g.failed(); ++i)
    configs.push_back(g.create(cudnn::EngineConfigDescriptor, "an engine configuration"));
  if (!g.failed() && count > 0)
    g.check(api.getAttribute(heuristics, cudnn::EngineHeurResults, cudnn::TypeBackendDescriptor, count, &count,
                             configs.data()),
            "the engine configurations");
  if (g.failed())
    return stringError(fmt::format("cuDNN {} does not build the attention ({}): {}", api.versionText(), s.key(),
                                   g.failure()));
  // A plan for each configuration that finalizes (finalizing compiles cuDNN's kernels for the
  // runtime-compiled engines: at most kMaxCandidates of them; `only`, when given, alone).
  a->engineConfigs_ = int(count);
  std::string refusals;
  for (int64_t i = 0; i < count && a->candidates_.size() < size_t(kMaxCandidates); ++i) {
    if (only >= 0 && i != only)
      continue;
    void *plan = nullptr;
    if (api.createDescriptor(cudnn::ExecutionPlanDescriptor, &plan) != 0)
      break;
    a->descriptors_.push_back(plan);
    void *config = configs[size_t(i)];
    int status = api.setAttribute(plan, cudnn::ExecutionPlanHandle, cudnn::TypeHandle, 1, &handle);
    if (status == 0)
      status = api.setAttribute(plan, cudnn::ExecutionPlanEngineConfig, cudnn::TypeBackendDescriptor, 1, &config);
    if (status == 0)
      status = api.finalize(plan);
    int64_t n = 0, workspace = 0;
    if (status == 0)
      status = api.getAttribute(plan, cudnn::ExecutionPlanWorkspaceSize, cudnn::TypeInt64, 1, &n, &workspace);
    if (status == 0) {
      a->candidates_.push_back({plan, workspace, int(i)});
      continue;
    }
    refusals += fmt::format("\n  configuration {}: {}", i, api.describe(status));
  }
  if (a->candidates_.empty() && only >= 0) // the configuration asked for is gone: any other
    return create(api, handle, s);
  if (a->candidates_.empty())
    return stringError(fmt::format("cuDNN {} has no plan for the attention ({}): {} engine configurations{}",
                                   api.versionText(), s.key(), count, refusals));
  return std::move(a);
}

CudnnAttention::~CudnnAttention() {
  // In reverse: the plan before the configurations, the graph before its operations and tensors.
  for (auto it = descriptors_.rbegin(); it != descriptors_.rend(); ++it)
    api_.destroyDescriptor(*it);
}

CudnnAttention::Buffers::~Buffers() {
  if (pack_)
    api_.destroyDescriptor(pack_);
}

llvm::Expected<std::unique_ptr<CudnnAttention::Buffers>> CudnnAttention::buffers(llvm::ArrayRef<void *> pointers,
                                                                                 void *workspace) const {
  size_t operands = operandCount(shape_);
  if (pointers.size() != operands)
    return stringError(fmt::format("error: cuDNN's attention takes {} buffers, got {}", operands, pointers.size()));
  std::unique_ptr<Buffers> b(new Buffers(api_));
  b->pointers_.assign(pointers.begin(), pointers.end());
  b->workspace_ = workspace;
  std::vector<void *> data(pointers.begin(), pointers.end());
  data.push_back(const_cast<float *>(&scalars_.scale));
  data.push_back(const_cast<float *>(&scalars_.negativeInfinity));
  if (shape_.backward)
    data.push_back(const_cast<float *>(&scalars_.one));
  std::vector<void *> owned;
  GraphBuilder g(api_, owned);
  void *pack = g.create(cudnn::VariantPackDescriptor, "the variant pack");
  g.set(pack, cudnn::VariantPackUniqueIds, cudnn::TypeInt64, int64_t(uids_.size()), uids_.data(),
        "the variant pack's uids");
  g.set(pack, cudnn::VariantPackDataPointers, cudnn::TypeVoidPtr, int64_t(data.size()), data.data(),
        "the variant pack's pointers");
  g.set(pack, cudnn::VariantPackWorkspace, cudnn::TypeVoidPtr, 1, &workspace, "the variant pack's workspace");
  g.finalize(pack, "the variant pack");
  b->pack_ = pack; // owned by the Buffers from here on
  if (g.failed())
    return stringError(fmt::format("error: cuDNN's attention ({}): {}", shape_.key(), g.failure()));
  return std::move(b);
}

bool CudnnAttention::chooseConfig(int config) {
  for (size_t c = 0; c < candidates_.size(); ++c)
    if (candidates_[c].config == config) {
      chosen_ = c;
      return true;
    }
  return false;
}

int64_t CudnnAttention::largestWorkspaceBytes() const {
  int64_t largest = 0;
  for (const Candidate &c : candidates_)
    largest = std::max(largest, c.workspaceBytes);
  return largest;
}

llvm::Error CudnnAttention::run(void *handle, const Buffers &buffers, int candidate) const {
  void *plan = candidates_[candidate >= 0 ? size_t(candidate) : chosen_].plan;
  if (int status = api_.execute(handle, plan, buffers.pack_); status != 0)
    return stringError(fmt::format("error: cuDNN's attention ({}) failed: {}", shape_.key(), api_.describe(status)));
  return llvm::Error::success();
}

} // namespace tgc
