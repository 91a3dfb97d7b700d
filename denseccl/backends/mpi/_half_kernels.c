/* float16 / bfloat16 arithmetic for the MPI transport, compiled when a C compiler is present.

Each element is widened to float32 exactly, combined in float32 and rounded to the storage type
(round to nearest even): the rule of denseccl's NumPy kernels (backends/mpi/host_kernels.py), bit
for bit, in one pass. The loops are branch-free so the compiler vectorises them, and no float32
subnormal is ever an operand, so flush-to-zero/denormals-are-zero modes change nothing.

Buffers arrive as addresses (Python ints): the callers hold the memory. The GIL is released
while a loop runs. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { SUM = 0, PRODUCT = 1, MIN = 2, MAX = 3 };
enum { FLOAT16 = 0, BFLOAT16 = 1 };

static inline float from_bits(uint32_t bits) { float value; memcpy(&value, &bits, 4); return value; }
static inline uint32_t to_bits(float value) { uint32_t bits; memcpy(&bits, &value, 4); return bits; }

static inline float widen_float16(uint16_t half) {
    uint32_t sign = (uint32_t)(half & 0x8000u) << 16;
    uint32_t magnitude = half & 0x7fffu;
    uint32_t normal = (magnitude << 13) + ((uint32_t)(127 - 15) << 23);
    uint32_t subnormal = to_bits((float)(magnitude & 0x3ffu) * 0x1p-24f);  /* exact: < 2**10 */
    uint32_t special = (magnitude << 13) | 0x7f800000u;                   /* inf, NaN (payload kept) */
    uint32_t bits = magnitude < 0x0400u ? subnormal : magnitude < 0x7c00u ? normal : special;
    return from_bits(bits | sign);
}

static inline uint16_t narrow_float16(float single) {
    uint32_t bits = to_bits(single);
    uint32_t sign = (bits >> 16) & 0x8000u;
    uint32_t magnitude = bits & 0x7fffffffu;
    uint32_t nan = 0x7c00u | ((magnitude & 0x7fffffu) >> 13);
    nan = nan == 0x7c00u ? 0x7c01u : nan;                                 /* stays a NaN */
    uint32_t normal = magnitude - ((uint32_t)(127 - 15) << 23);
    normal = (normal + 0xfffu + ((normal >> 13) & 1u)) >> 13;             /* may carry into inf */
    /* below 2**-14: the count of 2**-24 steps, rounded to nearest even by the float adder */
    uint32_t subnormal = to_bits(from_bits(magnitude) * 0x1p24f + 0x1p23f) - 0x4b000000u;
    uint32_t result = magnitude > 0x7f800000u ? nan
                    : magnitude >= 0x47800000u ? 0x7c00u
                    : magnitude >= 0x38800000u ? normal
                    : subnormal;
    return (uint16_t)(result | sign);
}

static inline float widen_bfloat16(uint16_t half) { return from_bits((uint32_t)half << 16); }

static inline uint16_t narrow_bfloat16(float single) {
    uint32_t bits = to_bits(single);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

static inline float combine(int kind, float incoming, float result) {
    switch (kind) {
    case SUM: return incoming + result;
    case PRODUCT: return incoming * result;
    case MIN: return (incoming < result || incoming != incoming) ? incoming : result;  /* ties: result's */
    default: return (incoming > result || incoming != incoming) ? incoming : result;
    }
}

/* x86-64 with GCC or Clang on glibc: one copy of each portable loop per vector width, chosen at
load, and float16 loops on the F16C conversion instructions where the CPU has them. */
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define X86_DISPATCH 1
#define VECTOR_CLONES __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#include <immintrin.h>
#else
#define X86_DISPATCH 0
#define VECTOR_CLONES
#endif

/* One loop per (type, op) so that each is a straight vectorisable body. */
#define REDUCE_LOOP(WIDEN, NARROW, KIND)                                                   \
    for (Py_ssize_t i = 0; i < count; i++)                                                 \
        result[i] = NARROW(combine(KIND, WIDEN(incoming[i]), WIDEN(result[i])));

#define REDUCE_ALL_OPS(WIDEN, NARROW)                                                      \
    switch (kind) {                                                                        \
    case SUM: REDUCE_LOOP(WIDEN, NARROW, SUM) break;                                      \
    case PRODUCT: REDUCE_LOOP(WIDEN, NARROW, PRODUCT) break;                              \
    case MIN: REDUCE_LOOP(WIDEN, NARROW, MIN) break;                                      \
    default: REDUCE_LOOP(WIDEN, NARROW, MAX) break;                                       \
    }

VECTOR_CLONES static void reduce_portable(int type, int kind, const uint16_t *incoming, uint16_t *result,
                                          Py_ssize_t count) {
    if (type == FLOAT16) {
        REDUCE_ALL_OPS(widen_float16, narrow_float16)
    } else {
        REDUCE_ALL_OPS(widen_bfloat16, narrow_bfloat16)
    }
}

VECTOR_CLONES static void scale_portable(int type, int divide, const uint16_t *source, uint16_t *destination,
                                         Py_ssize_t count, float factor) {
    /* source and destination may be the same memory: element i is read before it is written */
    if (type == FLOAT16) {
        if (divide)
            for (Py_ssize_t i = 0; i < count; i++) destination[i] = narrow_float16(widen_float16(source[i]) / factor);
        else
            for (Py_ssize_t i = 0; i < count; i++) destination[i] = narrow_float16(widen_float16(source[i]) * factor);
    } else {
        if (divide)
            for (Py_ssize_t i = 0; i < count; i++) destination[i] = narrow_bfloat16(widen_bfloat16(source[i]) / factor);
        else
            for (Py_ssize_t i = 0; i < count; i++) destination[i] = narrow_bfloat16(widen_bfloat16(source[i]) * factor);
    }
}

#if X86_DISPATCH
/* float16 with VCVTPH2PS/VCVTPS2PH: exact widening, and narrowing rounded to nearest even
   (explicit rounding control, whatever MXCSR says). Eight elements a step; the tail goes to the
   portable loop, so both give the same bits (NaN payloads aside, which the hardware quiets). */
#define F16C_TARGET __attribute__((target("avx2,f16c")))
#define F16C_LOAD(pointer) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pointer)))
#define F16C_STORE(pointer, value) \
    _mm_storeu_si128((__m128i *)(pointer), _mm256_cvtps_ph((value), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))

F16C_TARGET static inline __m256 combine_f16c(int kind, __m256 incoming, __m256 result) {
    switch (kind) {
    case SUM: return _mm256_add_ps(incoming, result);
    case PRODUCT: return _mm256_mul_ps(incoming, result);
    case MIN: {
        __m256 take = _mm256_or_ps(_mm256_cmp_ps(incoming, result, _CMP_LT_OQ), _mm256_cmp_ps(incoming, incoming, _CMP_UNORD_Q));
        return _mm256_blendv_ps(result, incoming, take);
    }
    default: {
        __m256 take = _mm256_or_ps(_mm256_cmp_ps(incoming, result, _CMP_GT_OQ), _mm256_cmp_ps(incoming, incoming, _CMP_UNORD_Q));
        return _mm256_blendv_ps(result, incoming, take);
    }
    }
}

#define REDUCE_F16C_LOOP(KIND)                                                             \
    for (; i + 8 <= count; i += 8)                                                         \
        F16C_STORE(result + i, combine_f16c(KIND, F16C_LOAD(incoming + i), F16C_LOAD(result + i)));

F16C_TARGET static Py_ssize_t reduce_float16_f16c(int kind, const uint16_t *incoming, uint16_t *result,
                                                  Py_ssize_t count) {
    Py_ssize_t i = 0;
    switch (kind) {
    case SUM: REDUCE_F16C_LOOP(SUM) break;
    case PRODUCT: REDUCE_F16C_LOOP(PRODUCT) break;
    case MIN: REDUCE_F16C_LOOP(MIN) break;
    default: REDUCE_F16C_LOOP(MAX) break;
    }
    return i;
}

F16C_TARGET static Py_ssize_t scale_float16_f16c(int divide, const uint16_t *source, uint16_t *destination,
                                                 Py_ssize_t count, float factor) {
    Py_ssize_t i = 0;
    __m256 by = _mm256_set1_ps(factor);
    if (divide)
        for (; i + 8 <= count; i += 8) F16C_STORE(destination + i, _mm256_div_ps(F16C_LOAD(source + i), by));
    else
        for (; i + 8 <= count; i += 8) F16C_STORE(destination + i, _mm256_mul_ps(F16C_LOAD(source + i), by));
    return i;
}

static int has_f16c(void) {
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    }
    return known;
}
#endif

static void reduce_loop(int type, int kind, const uint16_t *incoming, uint16_t *result, Py_ssize_t count) {
#if X86_DISPATCH
    if (type == FLOAT16 && has_f16c()) {
        Py_ssize_t done = reduce_float16_f16c(kind, incoming, result, count);
        incoming += done, result += done, count -= done;
    }
#endif
    reduce_portable(type, kind, incoming, result, count);
}

static void scale_loop(int type, int divide, const uint16_t *source, uint16_t *destination, Py_ssize_t count,
                       float factor) {
#if X86_DISPATCH
    if (type == FLOAT16 && has_f16c()) {
        Py_ssize_t done = scale_float16_f16c(divide, source, destination, count, factor);
        source += done, destination += done, count -= done;
    }
#endif
    scale_portable(type, divide, source, destination, count, factor);
}

static int check_type(int type) {
    if (type == FLOAT16 || type == BFLOAT16) return 1;
    PyErr_Format(PyExc_ValueError, "type %d is neither float16 (0) nor bfloat16 (1)", type);
    return 0;
}

PyDoc_STRVAR(reduce_doc, "reduce(type, kind, incoming, result, count): result[i] = incoming[i] (op) result[i]\n"
                         "type 0 float16, 1 bfloat16; kind 0 sum, 1 prod, 2 min, 3 max; addresses as ints.");

static PyObject *reduce(PyObject *self, PyObject *args) {
    int type, kind;
    Py_ssize_t incoming, result, count;
    if (!PyArg_ParseTuple(args, "iinnn", &type, &kind, &incoming, &result, &count)) return NULL;
    if (!check_type(type)) return NULL;
    if (kind < SUM || kind > MAX) return PyErr_Format(PyExc_ValueError, "kind %d is not 0..3", kind);
    Py_BEGIN_ALLOW_THREADS
    reduce_loop(type, kind, (const uint16_t *)incoming, (uint16_t *)result, count);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyDoc_STRVAR(scale_doc, "scale(type, divide, source, destination, count, factor): destination[i] =\n"
                        "source[i] * factor (or / factor when divide), computed in float32.");

static PyObject *scale(PyObject *self, PyObject *args) {
    int type, divide;
    Py_ssize_t source, destination, count;
    float factor;
    if (!PyArg_ParseTuple(args, "iinnnf", &type, &divide, &source, &destination, &count, &factor)) return NULL;
    if (!check_type(type)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    scale_loop(type, divide, (const uint16_t *)source, (uint16_t *)destination, count, factor);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"reduce", reduce, METH_VARARGS, reduce_doc},
    {"scale", scale, METH_VARARGS, scale_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "denseccl.backends.mpi._half_kernels",
                                    "float16/bfloat16 reduction and scaling loops (see the C source).", -1, methods};

PyMODINIT_FUNC PyInit__half_kernels(void) { return PyModule_Create(&module); }
