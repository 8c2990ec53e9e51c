/* Strict JSON scanning for the C readers of JSON text (jaegerin.c: Jaeger's answers; otlpjson.c: OTLP JSON lines),
 * header-only so that each module inlines it. It reads only what Python's json module reads the same way: a string
 * with a raw control character, a number Python would read as NaN or Infinity, a leading zero, nesting deeper than
 * JSON_MAX_DEPTH or a truncated value is answered with FALLBACK (the caller leaves the text to its Python twin, which
 * parses it with json and reports what it finds). Strings are returned as byte ranges of the text, with a flag when
 * they hold an escape: the readers decode only plain strings themselves.
 */
#ifndef CPTRACE_JSONSCAN_H
#define CPTRACE_JSONSCAN_H

#include "value.h"

#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define JSON_MAX_DEPTH 64

typedef struct {
    const char *p, *end;
} Rd;

typedef struct {
    const char *p;
    Py_ssize_t n;
} Str;

/* -- strict JSON ------------------------------------------------------------------------------------------------ */

static inline void ws(Rd *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\n' || *r->p == '\r' || *r->p == '\t'))
        r->p++;
}

static inline int lit(Rd *r, char c)
{
    ws(r);
    if (r->p < r->end && *r->p == c) {
        r->p++;
        return 1;
    }
    return 0;
}

#if defined(__SSE2__)
/* The offset of the first '"', '\\' or control character (< 0x20) among the 16 bytes at p, or 16: a string's body is
 * scanned 16 bytes at a time up to the next byte the loop below must look at (strings are most of an answer's bytes;
 * byte by byte, they were a third of index()'s time). */
static inline int special16(const char *p)
{
    __m128i x = _mm_loadu_si128((const __m128i *)p);
    __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('"')), _mm_cmpeq_epi8(x, _mm_set1_epi8('\\'))),
                             _mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(0x1F)), x));
    int mask = _mm_movemask_epi8(m);
    return mask ? __builtin_ctz((unsigned)mask) : 16;
}
#endif

/* a string (r at its '"'): its body in *s; esc set when it holds an escape */
static inline int str_tok(Rd *r, Str *s, int *esc)
{
    ws(r);
    if (r->p >= r->end || *r->p != '"')
        return FALLBACK;
    const char *q = ++r->p;
    *esc = 0;
    while (r->p < r->end) {
#if defined(__SSE2__)
        while (r->end - r->p >= 16) {
            int k = special16(r->p);
            r->p += k;
            if (k < 16)
                break;
        }
        if (r->p >= r->end)
            break;
#endif
        unsigned char c = (unsigned char)*r->p;
        if (c == '"') {
            s->p = q;
            s->n = r->p - q;
            r->p++;
            return OK;
        }
        if (c < 0x20)
            return FALLBACK;
        if (c == '\\') {
            *esc = 1;
            if (r->end - r->p < 2)
                return FALLBACK;
            char e = r->p[1];
            if (e == 'u') {
                if (r->end - r->p < 6)
                    return FALLBACK;
                for (int i = 2; i < 6; i++)
                    if (!strchr("0123456789abcdefABCDEF", r->p[i]) || r->p[i] == 0)
                        return FALLBACK;
                r->p += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0)
                return FALLBACK;
            r->p += 2;
            continue;
        }
        r->p++;
    }
    return FALLBACK;
}

/* a string without escapes */
static inline int plain_str(Rd *r, Str *s)
{
    int esc;
    return str_tok(r, s, &esc) == OK && !esc ? OK : FALLBACK;
}

/* a number: *is_int when it is an integer token */
static inline int num_tok(Rd *r, Str *s, int *is_int)
{
    ws(r);
    const char *q = r->p;
    if (r->p < r->end && *r->p == '-')
        r->p++;
    if (r->p >= r->end || !is_digit(*r->p))
        return FALLBACK;
    if (*r->p == '0')
        r->p++;
    else
        while (r->p < r->end && is_digit(*r->p))
            r->p++;
    *is_int = 1;
    if (r->p < r->end && *r->p == '.') {
        *is_int = 0;
        r->p++;
        if (r->p >= r->end || !is_digit(*r->p))
            return FALLBACK;
        while (r->p < r->end && is_digit(*r->p))
            r->p++;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        *is_int = 0;
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-'))
            r->p++;
        if (r->p >= r->end || !is_digit(*r->p))
            return FALLBACK;
        while (r->p < r->end && is_digit(*r->p))
            r->p++;
    }
    s->p = q;
    s->n = r->p - q;
    return OK;
}

static inline int word(Rd *r, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(r->end - r->p) >= n && memcmp(r->p, w, n) == 0) {
        r->p += n;
        return OK;
    }
    return FALLBACK;
}

/* skip one value (validated); depth: its nesting level */
static int skip(Rd *r, int depth)
{
    if (depth > JSON_MAX_DEPTH)
        return FALLBACK;
    ws(r);
    if (r->p >= r->end)
        return FALLBACK;
    Str s;
    int x;
    switch (*r->p) {
    case '"':
        return str_tok(r, &s, &x);
    case '{':
        r->p++;
        if (lit(r, '}'))
            return OK;
        do {
            if (str_tok(r, &s, &x) != OK || !lit(r, ':') || skip(r, depth + 1) != OK)
                return FALLBACK;
        } while (lit(r, ','));
        return lit(r, '}') ? OK : FALLBACK;
    case '[':
        r->p++;
        if (lit(r, ']'))
            return OK;
        do {
            if (skip(r, depth + 1) != OK)
                return FALLBACK;
        } while (lit(r, ','));
        return lit(r, ']') ? OK : FALLBACK;
    case 't':
        return word(r, "true");
    case 'f':
        return word(r, "false");
    case 'n':
        return word(r, "null");
    default:
        return num_tok(r, &s, &x);
    }
}

/* An object's members, one at a time: the object grammar (its braces, each key and its ':', the ',' between) read
 * here, the readers reading each value where they stand:
 *
 *     int n = 0, st = OK;
 *     Str k;
 *     while (st == OK && next_key(r, &n, &k, &st)) {
 *         <the value at r, read as key k asks; st set to FALLBACK or ERR to stop>
 *     }
 *
 * next_key: 1 with the next key in *k (r at its value, *st untouched); 0 at the object's end (r past its '}'), or
 * with *st = FALLBACK when the text is not an object whose keys are plain strings (an escaped key: the twin reads
 * it). *n counts the keys met (0 before the first: r then at the object's '{'). */
static inline int next_key(Rd *r, int *n, Str *k, int *st)
{
    if ((*n)++ == 0) {
        if (!lit(r, '{')) {
            *st = FALLBACK;
            return 0;
        }
        if (lit(r, '}'))
            return 0;
    } else if (!lit(r, ',')) {
        if (!lit(r, '}'))
            *st = FALLBACK;
        return 0;
    }
    if (plain_str(r, k) == OK && lit(r, ':'))
        return 1;
    *st = FALLBACK;
    return 0;
}

/* a list (r at its '['), each element read by item(r, ctx): OK, FALLBACK (not a list, or item's answer) or ERR */
static inline int each(Rd *r, int (*item)(Rd *, void *), void *ctx)
{
    if (!lit(r, '['))
        return FALLBACK;
    if (lit(r, ']'))
        return OK;
    int st;
    do
        st = item(r, ctx);
    while (st == OK && lit(r, ','));
    return st == OK && !lit(r, ']') ? FALLBACK : st;
}

static inline int str_is(Str s, const char *w)
{
    return (size_t)s.n == strlen(w) && memcmp(s.p, w, (size_t)s.n) == 0;
}

static inline int str_is_key(Str s, PyObject *k)
{
    return s.n == PyBytes_GET_SIZE(k) && memcmp(s.p, PyBytes_AS_STRING(k), (size_t)s.n) == 0;
}

static inline PyObject *str_py(Str s)
{
    PyObject *o = PyUnicode_DecodeUTF8(s.p, s.n, "strict");
    if (o == NULL)
        PyErr_Clear();   /* (the caller falls back: the Python twin reads it with replacement characters) */
    return o;
}

static inline int int_py(Str s, PyObject **out)
{
    if (s.n > CPTRACE_VALUE_MAX_INT_DIGITS)
        return FALLBACK;
    return value_int(s.p, s.n, out);
}

#endif
