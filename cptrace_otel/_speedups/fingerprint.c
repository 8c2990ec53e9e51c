/* Exact CPU fingerprints at memory speed (upstream khash / knz / rng) for cptrace_otel.fingerprint.cpu; loaded by
 * fingerprint.py.
 *
 * khash is ((S1 ^ (S0 * 1000003) ^ n) & (2**63 - 1)) with S0 = sum b_i and S1 = sum b_i * (i + 1) over the n bytes
 * b of the tensor, in int64 wraparound arithmetic (see fingerprint/formula.py). Both sums are ring sums mod 2**64, so
 * any split and order gives the same value; here the bytes are read once, in blocks:
 *
 *   block of K chunks of 32 bytes starting at byte offset B, chunk c holding bytes b[B + 32c + j], j = 0..31:
 *     S0_blk = sum_c S0_c
 *     S1    += (B + 1) * S0_blk + 32 * sum_c c * S0_c + sum_c W_c,      W_c = sum_j j * b[B + 32c + j]
 *
 * The AVX2 kernel gets S0_c with one vpsadbw, W_c with vpmaddubsw/vpmaddwd against the weights 0..31 (exact in int16
 * and int32: 2 * 255 * 31 < 2**15, K * 4 * 255 * 31 < 2**31 for K <= 2**16), and sum_c c * S0_c from the running sum
 * of the S0_c (the Adler-32 trick: adding the running sum once per chunk gives sum_c (K - 1 - c) * S0_c). Nothing
 * per byte is wider than 32 bits and nothing is reduced horizontally before the end of a block. The portable kernel
 * (no AVX2, or another architecture) keeps uint32 column sums over rows of 32 bytes, which compilers vectorize.
 *
 * Inputs are read in place, never copied: an object exporting a C-contiguous buffer (bytes, numpy arrays, memoryview),
 * or an address and a byte count (a torch tensor's data_ptr() and nbytes, whose owner the caller keeps alive). The
 * GIL is released while a large buffer is read, so other threads of the traced process keep running.
 *
 * Functions (all exact; tests/unit/test_fingerprint_c.py holds them equal to the reference bit for bit):
 *   sums(src, nbytes=-1, start=0, portable=False) -> (S0, S1, nz)  the sums mod 2**64 for bytes whose first byte sits
 *                                                                   at logical offset start, and the nonzero count
 *   khash_knz(src, nbytes=-1) -> (khash, knz);  khash(src, nbytes=-1);  knz(src, nbytes=-1)
 *   minmax(src, code, count) -> (min, max, first, last) of count >= 1 integers of struct code q/i/h/b/B
 *                               (int64, int32, int16, int8, uint8): what upstream's rng text shows (Python writes
 *                               the text, whose keys are declared there)
 *   kernel() -> "avx2" or "portable": the kernel sums() uses by default on this machine
 *
 * Twin: cptrace_otel.fingerprint.reference.khash
 * Twin: cptrace_otel.fingerprint.reference.knz
 * Twin: cptrace_otel.fingerprint.formula.finish
 * Held equal by: tests/unit/test_fingerprint_c.py
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2_KERNEL 1
#include <immintrin.h>
#endif
/* The min/max loops of rng: a clone for AVX2 CPUs (int64 compares in vectors) chosen by the loader, where the
 * toolchain resolves clones at load time (GCC on ELF targets). */
#if defined(HAVE_AVX2_KERNEL) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

#define MULT 1000003ULL
#define MASK63 0x7FFFFFFFFFFFFFFFULL
/* Buffers at least this large are read with the GIL released (below it the release costs more than it gives). */
#define NOGIL_BYTES (64 * 1024)

typedef struct {
    uint64_t s0, s1, nz; /* S0, S1 (weights i + 1, i from 0 in this buffer) mod 2**64, and the nonzero count */
} Sums;

/* -- portable kernel ---------------------------------------------------------------------------------------------- */
/* The bytes as rows of COLS bytes, in blocks of k <= BLOCK_ROWS rows. Per block, lane arrays cs[j] = sum_r b[r][j]
 * and run[j] = sum_r (k - 1 - r) * b[r][j] (the running sum added once per row, as in the AVX2 kernel: additions
 * only, so SSE2 and NEON vectorize it across the COLS lanes; exact in uint32: 255 * 4096 * 4095 / 2 < 2**32); once
 * per block they are folded into the 64-bit sums, with cw[j] = sum_r r * b[r][j] = (k - 1) * cs[j] - run[j]:
 *   S1 += (B + 1) * S0_block + sum_j (j * cs[j] + COLS * cw[j]),  B = the block's byte offset. */
#define COLS 32
#define BLOCK_ROWS 4096

/* The bytes [from, n) one at a time, added to (s0, s1, nz), then stored in out: both kernels' tail and end. */
static void finish_tail(const uint8_t *p, size_t from, size_t n, uint64_t s0, uint64_t s1, uint64_t nz, Sums *out) {
    for (size_t i = from; i < n; i++) {
        uint64_t v = p[i];
        s0 += v;
        s1 += (uint64_t)(i + 1) * v;
        nz += v != 0;
    }
    out->s0 = s0;
    out->s1 = s1;
    out->nz = nz;
}

static void sums_portable(const uint8_t *p, size_t n, Sums *out) {
    uint64_t s0 = 0, s1 = 0, nz = 0;
    size_t rows = n / COLS, r = 0;
    while (r < rows) {
        size_t k = rows - r < BLOCK_ROWS ? rows - r : BLOCK_ROWS;
        const uint8_t *q = p + r * COLS;
        uint32_t cs[COLS] = {0}, run[COLS] = {0}, cz[COLS] = {0};
        for (size_t i = 0; i < k; i++) {
            const uint8_t *row = q + i * COLS;
            for (int j = 0; j < COLS; j++) {
                uint32_t v = row[j];
                run[j] += cs[j];
                cs[j] += v;
                cz[j] += v != 0;
            }
        }
        uint64_t bs0 = 0, bw = 0;
        for (int j = 0; j < COLS; j++) {
            uint64_t cw = (uint64_t)(k - 1) * cs[j] - run[j];
            bs0 += cs[j];
            bw += (uint64_t)j * cs[j] + (uint64_t)COLS * cw;
            nz += cz[j];
        }
        s1 += (uint64_t)(r * COLS + 1) * bs0 + bw;
        s0 += bs0;
        r += k;
    }
    finish_tail(p, rows * COLS, n, s0, s1, nz, out);
}

/* -- AVX2 kernel -------------------------------------------------------------------------------------------------- */
#ifdef HAVE_AVX2_KERNEL
/* Chunks per block: the int32 lanes of W stay exact (see the header) and the block's sums are folded into 64 bits. */
#define BLOCK_CHUNKS 1024

__attribute__((target("avx2,popcnt"))) static uint64_t hsum64(__m256i v) {
    __m128i s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_extract_epi64(s, 1);
}

__attribute__((target("avx2,popcnt"))) static void sums_avx2(const uint8_t *p, size_t n, int want_nz, Sums *out) {
    const __m256i zero = _mm256_setzero_si256();
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m256i weights = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                             21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
    uint64_t s0 = 0, s1 = 0, nz = 0;
    size_t chunks = n / 32, c = 0;
    while (c < chunks) {
        size_t k = chunks - c < BLOCK_CHUNKS ? chunks - c : BLOCK_CHUNKS;
        const uint8_t *q = p + c * 32;
        __m256i vs0 = zero, vrun = zero, vw = zero, vzeros = zero;
        for (size_t i = 0; i < k;) {
            /* zero bytes are counted per byte lane (cmpeq gives -1: subtracting it adds 1), at most 255 chunks
             * before the lanes are summed into vzeros with a vpsadbw: two vector ops a chunk, no scalar ones */
            size_t end = k - i < 255 ? k : i + 255;
            __m256i vz8 = zero;
            for (; i < end; i++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(q + i * 32));
                vrun = _mm256_add_epi64(vrun, vs0); /* after the block: sum_c (k - 1 - c) * S0_c */
                vs0 = _mm256_add_epi64(vs0, _mm256_sad_epu8(x, zero));
                vw = _mm256_add_epi32(vw, _mm256_madd_epi16(_mm256_maddubs_epi16(x, weights), ones16));
                if (want_nz) vz8 = _mm256_sub_epi8(vz8, _mm256_cmpeq_epi8(x, zero));
            }
            if (want_nz) vzeros = _mm256_add_epi64(vzeros, _mm256_sad_epu8(vz8, zero));
        }
        uint64_t zeros = hsum64(vzeros);
        uint64_t bs0 = hsum64(vs0);
        uint64_t run = hsum64(vrun);
        /* W lanes are non-negative int32: widen to 64 bits before summing the eight of them */
        uint64_t bw = hsum64(_mm256_add_epi64(_mm256_cvtepu32_epi64(_mm256_castsi256_si128(vw)),
                                              _mm256_cvtepu32_epi64(_mm256_extracti128_si256(vw, 1))));
        uint64_t csum = (uint64_t)(k - 1) * bs0 - run; /* sum_c c * S0_c */
        s1 += (uint64_t)(c * 32 + 1) * bs0 + 32 * csum + bw;
        s0 += bs0;
        nz += (uint64_t)k * 32 - zeros;
        c += k;
    }
    finish_tail(p, chunks * 32, n, s0, s1, nz, out);
}
#endif

static int use_avx2 = 0; /* set once at import: the CPU runs AVX2 */

static void compute(const uint8_t *p, size_t n, int want_nz, int portable, Sums *out) {
#ifdef HAVE_AVX2_KERNEL
    if (use_avx2 && !portable) {
        sums_avx2(p, n, want_nz, out);
        return;
    }
#endif
    (void)want_nz;
    sums_portable(p, n, out);
}

/* -- argument handling -------------------------------------------------------------------------------------------- */
typedef struct {
    Py_buffer view;
    int has_view;
    const uint8_t *p;
    size_t n;
} Src;

/* src is an int address (then nbytes >= 0 is required) or an object exporting a C-contiguous buffer (then nbytes
 * must be -1 or at most its length). */
static int src_open(PyObject *src, Py_ssize_t nbytes, Src *s) {
    s->has_view = 0;
    if (PyLong_Check(src)) {
        if (nbytes < 0) {
            PyErr_SetString(PyExc_ValueError, "an address needs nbytes >= 0");
            return -1;
        }
        void *addr = PyLong_AsVoidPtr(src);
        if (addr == NULL && PyErr_Occurred()) return -1;
        if (addr == NULL && nbytes > 0) {
            PyErr_SetString(PyExc_ValueError, "null address");
            return -1;
        }
        s->p = (const uint8_t *)addr;
        s->n = (size_t)nbytes;
        return 0;
    }
    if (PyObject_GetBuffer(src, &s->view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    s->has_view = 1;
    if (nbytes > s->view.len) {
        PyBuffer_Release(&s->view);
        s->has_view = 0;
        PyErr_SetString(PyExc_ValueError, "nbytes exceeds the buffer");
        return -1;
    }
    s->p = (const uint8_t *)s->view.buf;
    s->n = (size_t)(nbytes >= 0 ? nbytes : s->view.len);
    return 0;
}

static void src_close(Src *s) {
    if (s->has_view) PyBuffer_Release(&s->view);
}

static int run(PyObject *src, Py_ssize_t nbytes, int want_nz, int portable, Sums *out, size_t *n) {
    Src s;
    if (src_open(src, nbytes, &s) < 0) return -1;
    if (s.n >= NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS compute(s.p, s.n, want_nz, portable, out);
        Py_END_ALLOW_THREADS
    } else {
        compute(s.p, s.n, want_nz, portable, out);
    }
    *n = s.n;
    src_close(&s);
    return 0;
}

static uint64_t finish(const Sums *s, size_t n) {
    return (s->s1 ^ (s->s0 * MULT) ^ (uint64_t)n) & MASK63;
}

static PyObject *py_sums(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"src", "nbytes", "start", "portable", NULL};
    PyObject *src, *start_obj = NULL;
    Py_ssize_t nbytes = -1;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|nOp", names, &src, &nbytes, &start_obj, &portable)) return NULL;
    uint64_t start = 0;
    if (start_obj != NULL) {
        start = PyLong_AsUnsignedLongLongMask(start_obj); /* any int, taken mod 2**64 */
        if (start == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    }
    Sums s;
    size_t n;
    if (run(src, nbytes, 1, portable, &s, &n) < 0) return NULL;
    /* weights start + i + 1 = (i + 1) + start */
    return Py_BuildValue("(KKK)", (unsigned long long)s.s0, (unsigned long long)(s.s1 + start * s.s0),
                         (unsigned long long)s.nz);
}

/* The sums of the (src, nbytes=-1) of args; want_nz: also the nonzero count. */
static int sums_of_args(PyObject *args, int want_nz, Sums *s, size_t *n) {
    PyObject *src;
    Py_ssize_t nbytes = -1;
    if (!PyArg_ParseTuple(args, "O|n", &src, &nbytes)) return -1;
    return run(src, nbytes, want_nz, 0, s, n);
}

static PyObject *py_khash_knz(PyObject *self, PyObject *args) {
    Sums s;
    size_t n;
    if (sums_of_args(args, 1, &s, &n) < 0) return NULL;
    return Py_BuildValue("(KK)", (unsigned long long)finish(&s, n), (unsigned long long)s.nz);
}

static PyObject *py_khash(PyObject *self, PyObject *args) {
    Sums s;
    size_t n;
    if (sums_of_args(args, 0, &s, &n) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(finish(&s, n));
}

static PyObject *py_knz(PyObject *self, PyObject *args) {
    /* the fused pass: at memory speed the sums cost nothing beside the count */
    Sums s;
    size_t n;
    if (sums_of_args(args, 1, &s, &n) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(s.nz);
}

/* -- minmax (rng) ---------------------------------------------------------------------------------------------------------- */
#define MINMAX(T)                                                                                                      \
    VECTOR_CLONES static void minmax_##T(const void *buf, size_t n, long long *lo, long long *hi) {                   \
        const T *a = (const T *)buf;                                                                                   \
        T mn = a[0], mx = a[0];                                                                                        \
        for (size_t i = 1; i < n; i++) {                                                                               \
            mn = a[i] < mn ? a[i] : mn;                                                                                \
            mx = a[i] > mx ? a[i] : mx;                                                                                \
        }                                                                                                              \
        *lo = (long long)mn;                                                                                           \
        *hi = (long long)mx;                                                                                           \
    }
MINMAX(int64_t)
MINMAX(int32_t)
MINMAX(int16_t)
MINMAX(int8_t)
MINMAX(uint8_t)

static PyObject *py_minmax(PyObject *self, PyObject *args) {
    PyObject *src;
    int code;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "OCn", &src, &code, &count)) return NULL;
    size_t item;
    void (*mm)(const void *, size_t, long long *, long long *);
    switch (code) {
    case 'q': item = 8, mm = minmax_int64_t; break;
    case 'i': item = 4, mm = minmax_int32_t; break;
    case 'h': item = 2, mm = minmax_int16_t; break;
    case 'b': item = 1, mm = minmax_int8_t; break;
    case 'B': item = 1, mm = minmax_uint8_t; break;
    default: PyErr_Format(PyExc_ValueError, "minmax: unsupported struct letter %c", code); return NULL;
    }
    if (count < 1) {
        PyErr_SetString(PyExc_ValueError, "minmax: count must be >= 1");
        return NULL;
    }
    if ((size_t)count > (size_t)PY_SSIZE_T_MAX / item) {
        PyErr_SetString(PyExc_OverflowError, "minmax: count too large");
        return NULL;
    }
    Src s;
    if (src_open(src, PyLong_Check(src) ? count * (Py_ssize_t)item : -1, &s) < 0) return NULL;
    if (s.n < (size_t)count * item) {
        src_close(&s);
        PyErr_SetString(PyExc_ValueError, "minmax: buffer shorter than count elements");
        return NULL;
    }
    long long lo, hi, first, last;
    if (s.n >= NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS mm(s.p, (size_t)count, &lo, &hi);
        Py_END_ALLOW_THREADS
    } else {
        mm(s.p, (size_t)count, &lo, &hi);
    }
    /* first and last through the same reader: a one-element min/max */
    mm(s.p, 1, &first, &first);
    mm(s.p + ((size_t)count - 1) * item, 1, &last, &last);
    src_close(&s);
    return Py_BuildValue("(LLLL)", lo, hi, first, last);
}

static PyObject *py_kernel(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(use_avx2 ? "avx2" : "portable");
}

static PyMethodDef methods[] = {
    {"sums", (PyCFunction)(void (*)(void))py_sums, METH_VARARGS | METH_KEYWORDS,
     "sums(src, nbytes=-1, start=0, portable=False) -> (S0, S1, nz): the khash sums mod 2**64 of the bytes (weights "
     "start + i + 1) and their nonzero count; src is a C-contiguous buffer or an int address with nbytes."},
    {"khash_knz", py_khash_knz, METH_VARARGS, "khash_knz(src, nbytes=-1) -> (khash, knz) of the bytes."},
    {"khash", py_khash, METH_VARARGS, "khash(src, nbytes=-1) -> upstream khash of the bytes (n >= 1)."},
    {"knz", py_knz, METH_VARARGS, "knz(src, nbytes=-1) -> number of nonzero bytes."},
    {"minmax", py_minmax, METH_VARARGS,
     "minmax(src, letter, n) -> (lowest, highest, at 0, at n - 1) of n >= 1 integers of struct letter q/i/h/b/B."},
    {"kernel", py_kernel, METH_NOARGS, "kernel() -> 'avx2' or 'portable': the default kernel on this CPU."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fingerprint", "Exact CPU fingerprints (khash/knz/rng).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__fingerprint(void) {
#ifdef HAVE_AVX2_KERNEL
    __builtin_cpu_init();
    use_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
#endif
    return PyModule_Create(&module);
}
