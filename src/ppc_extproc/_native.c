/* Hot loops of the request path, one call per prompt (pure-Python equivalents in
 * ppc_extproc/native.py, which tests hold to the same results):
 *
 *   json_uint32_array(buf, pos) -> (le32 bytes, index of ']') | None
 *       a JSON array of plain integers in [0, 2^32) starting at buf[pos] == '['; None for
 *       anything else (floats, exponents, signs, leading zeros, nesting, bad separators), which the
 *       caller hands to the reference parser.
 *   msgpack_uint32_array(buf) -> le32 bytes | None
 *       ``buf`` is exactly one msgpack array of unsigned ints in [0, 2^32) (positive fixint,
 *       uint8, uint16, uint32 encodings); None for anything else (other int encodings, negative
 *       or wider values, non-ints, nesting, truncated or trailing bytes).
 *   xxh64_chain(parent, tokens_le32, block_size, n_blocks, reuse=None) -> list[int]
 *       key_i = XXH64(LE64(key_{i-1}) || 4*block_size token bytes, seed 0), key_{-1} = parent.
 *   cbor_fnv_chain(parent, tokens_le32, block_size, n_blocks, reuse=None) -> list[int]
 *       key_i = FNV-1a-64(canonical CBOR [key_{i-1}, [t...], null]).
 *       Both: the leading keys equal to those of the list ``reuse`` are its int objects.
 *   dict_prefix(young, old, keys, limit), remap(target, keys, values, mapping)
 *       the index's bulk probes and writes, on dicts or on U64Maps (_u64map.c).
 *
 * Written from the public definitions: XXH64 (Cyan4973/xxHash doc/xxhash_spec.md), FNV-1a 64
 * (draft-eastlake-fnv), CBOR heads (RFC 8949 section 3, shortest form), msgpack
 * (msgpack/msgpack spec.md: array and int formats). */
#include "_u64map.h"

#include <stdint.h>
#include <string.h>

/* ---- XXH64 ------------------------------------------------------------------------------- */

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const unsigned char *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

static inline uint32_t read32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t xround(uint64_t acc, uint64_t lane) {
    acc += lane * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static inline uint64_t xmerge(uint64_t acc, uint64_t val) {
    acc ^= xround(0, val);
    return acc * P1 + P4;
}

static uint64_t xxh64(const unsigned char *p, size_t len, uint64_t seed) {
    const unsigned char *end = p + len;
    uint64_t acc;
    if (len >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        const unsigned char *limit = end - 32;
        do {
            v1 = xround(v1, read64(p));
            v2 = xround(v2, read64(p + 8));
            v3 = xround(v3, read64(p + 16));
            v4 = xround(v4, read64(p + 24));
            p += 32;
        } while (p <= limit);
        acc = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        acc = xmerge(acc, v1);
        acc = xmerge(acc, v2);
        acc = xmerge(acc, v3);
        acc = xmerge(acc, v4);
    } else {
        acc = seed + P5;
    }
    acc += (uint64_t)len;
    while (end - p >= 8) {
        acc ^= xround(0, read64(p));
        acc = rotl64(acc, 27) * P1 + P4;
        p += 8;
    }
    if (end - p >= 4) {
        acc ^= (uint64_t)read32(p) * P1;
        acc = rotl64(acc, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        acc ^= (uint64_t)(*p) * P5;
        acc = rotl64(acc, 11) * P1;
        p++;
    }
    acc ^= acc >> 33;
    acc *= P2;
    acc ^= acc >> 29;
    acc *= P3;
    acc ^= acc >> 32;
    return acc;
}

/* ---- FNV-1a 64 over canonical CBOR --------------------------------------------------------- */

#define FNV_OFFSET 0xCBF29CE484222325ULL
#define FNV_PRIME 0x100000001B3ULL

static inline uint64_t fnv_byte(uint64_t h, unsigned char b) { return (h ^ b) * FNV_PRIME; }

/* The shortest CBOR head of a major type and argument, fed to the hash. */
static inline uint64_t fnv_head(uint64_t h, unsigned major, uint64_t value) {
    unsigned char mt = (unsigned char)(major << 5);
    if (value < 24) return fnv_byte(h, mt | (unsigned char)value);
    int bytes;
    if (value < 0x100) {
        h = fnv_byte(h, mt | 24);
        bytes = 1;
    } else if (value < 0x10000) {
        h = fnv_byte(h, mt | 25);
        bytes = 2;
    } else if (value < 0x100000000ULL) {
        h = fnv_byte(h, mt | 26);
        bytes = 4;
    } else {
        h = fnv_byte(h, mt | 27);
        bytes = 8;
    }
    for (int i = bytes - 1; i >= 0; i--) h = fnv_byte(h, (unsigned char)(value >> (8 * i)));
    return h;
}

/* ---- argument handling --------------------------------------------------------------------- */

typedef uint64_t (*chain_step)(uint64_t parent, const unsigned char *block, Py_ssize_t block_size,
                               unsigned char *scratch);

static uint64_t xxh64_step(uint64_t parent, const unsigned char *block, Py_ssize_t block_size,
                           unsigned char *scratch) {
    for (int i = 0; i < 8; i++) scratch[i] = (unsigned char)(parent >> (8 * i));
    memcpy(scratch + 8, block, (size_t)block_size * 4);
    return xxh64(scratch, 8 + (size_t)block_size * 4, 0);
}

static uint64_t cbor_fnv_step(uint64_t parent, const unsigned char *block, Py_ssize_t block_size,
                              unsigned char *scratch) {
    (void)scratch;
    uint64_t h = fnv_byte(FNV_OFFSET, 0x83);
    h = fnv_head(h, 0, parent);
    h = fnv_head(h, 4, (uint64_t)block_size);
    for (Py_ssize_t i = 0; i < block_size; i++) h = fnv_head(h, 0, read32(block + 4 * i));
    return fnv_byte(h, 0xf6);
}

static PyObject *run_chain(PyObject *args, chain_step step) {
    PyObject *parent_obj, *reuse = Py_None;
    Py_buffer view;
    Py_ssize_t block_size, n_blocks;
    if (!PyArg_ParseTuple(args, "Oy*nn|O", &parent_obj, &view, &block_size, &n_blocks, &reuse)) return NULL;
    if (reuse != Py_None && !PyList_Check(reuse)) {
        PyErr_SetString(PyExc_TypeError, "reuse must be a list or None");
        goto fail;
    }
    uint64_t parent = PyLong_AsUnsignedLongLong(parent_obj);
    if (parent == (uint64_t)-1 && PyErr_Occurred()) goto fail;
    if (block_size <= 0 || n_blocks < 0 || n_blocks > view.len / (4 * block_size)) {
        PyErr_SetString(PyExc_ValueError, "n_blocks full blocks of block_size tokens exceed the buffer");
        goto fail;
    }
    uint64_t *keys = PyMem_RawMalloc(sizeof(uint64_t) * (size_t)(n_blocks ? n_blocks : 1));
    unsigned char *scratch = PyMem_RawMalloc(8 + (size_t)block_size * 4);
    if (keys == NULL || scratch == NULL) {
        PyMem_RawFree(keys);
        PyMem_RawFree(scratch);
        PyErr_NoMemory();
        goto fail;
    }
    const unsigned char *data = view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n_blocks; i++) {
        parent = step(parent, data + i * block_size * 4, block_size, scratch);
        keys[i] = parent;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(scratch);
    PyBuffer_Release(&view);
    PyObject *out = PyList_New(n_blocks);
    if (out == NULL) {
        PyMem_RawFree(keys);
        return NULL;
    }
    /* The leading keys equal to reuse's are reuse's objects: a dict probe with the very object it
     * stores matches by identity, without reading the stored key (a cache miss per block). */
    Py_ssize_t shared = 0;
    if (reuse != Py_None) {
        Py_ssize_t limit = PyList_GET_SIZE(reuse) < n_blocks ? PyList_GET_SIZE(reuse) : n_blocks;
        while (shared < limit) {
            PyObject *item = PyList_GET_ITEM(reuse, shared);
            if (!PyLong_CheckExact(item)) break;
            uint64_t value;
            if (u64_key(item, &value) < 0) {
                PyErr_Clear();
                break;
            }
            if (value != keys[shared]) break;
            Py_INCREF(item);
            PyList_SET_ITEM(out, shared, item);
            shared++;
        }
    }
    for (Py_ssize_t i = shared; i < n_blocks; i++) {
        PyObject *key = PyLong_FromUnsignedLongLong(keys[i]);
        if (key == NULL) {
            PyMem_RawFree(keys);
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, key);
    }
    PyMem_RawFree(keys);
    return out;
fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *xxh64_chain(PyObject *self, PyObject *args) {
    (void)self;
    return run_chain(args, xxh64_step);
}

static PyObject *cbor_fnv_chain(PyObject *self, PyObject *args) {
    (void)self;
    return run_chain(args, cbor_fnv_step);
}

/* ---- JSON array of uint32 ------------------------------------------------------------------ */

static inline int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The leading run of ASCII digits in the 8 bytes at p, as (count, value): 8 bytes are read at
 * once (SWAR: a byte is a digit iff its high nibble is 3 and adding 6 keeps it so; a carry out of
 * a non-digit byte only reaches later bytes), the digits combined in three multiplications
 * (simdjson's parse_eight_digits_unrolled, Lemire, "Faster Number Parsing"). Needs 8 readable
 * bytes at p. count is 8 when all are digits (value then unset). */
static inline int digit_run8(const unsigned char *p, uint32_t *value) {
    uint64_t x;
    memcpy(&x, p, 8);
#if PY_BIG_ENDIAN
    x = __builtin_bswap64(x);
#endif
    uint64_t bad = ((x & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL) |
                   (((x + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL);
    if (bad == 0) return 8;
    int count = __builtin_ctzll(bad) >> 3;
    if (count == 0) return 0;
    uint64_t v = (x - 0x3030303030303030ULL) << (8 * (8 - count)); /* leading zeros in front */
    v = v * 10 + (v >> 8);
    v = (((v & 0x000000FF000000FFULL) * 0x000F424000000064ULL) +
         (((v >> 16) & 0x000000FF000000FFULL) * 0x0000271000000001ULL)) >> 32;
    *value = (uint32_t)v;
    return count;
}

/* Parses s[pos..close] as '[' ws (uint (ws ',' ws uint)*)? ws ']' where s[close] is the first ']'
 * after pos (so every loop below stops there without a bounds check) and s has len bytes. Returns
 * close and the values in out (count in *count), or -1 when the text is anything else. */
static Py_ssize_t scan_uint32_array(const unsigned char *s, Py_ssize_t len, Py_ssize_t close, Py_ssize_t pos,
                                    uint32_t *out, Py_ssize_t *count) {
    Py_ssize_t n = 0;
    const unsigned char *p = s + pos, *end = s + close;
    const Py_ssize_t wide_end = len - 8; /* the last offset with 8 readable bytes */
    if (*p != '[') return -1;
    p++;
    while (is_ws(*p)) p++;
    if (p == end) {
        *count = 0;
        return close;
    }
    for (;;) {
        uint32_t fast;
        int run = p - s <= wide_end ? digit_run8(p, &fast) : 8;
        if (run < 8) {
            if (run == 0 || (run > 1 && *p == '0')) return -1; /* no leading zeros: "0" stands alone */
            out[n++] = fast;
            p += run;
        } else { /* 8 digits or more, or near the end of the buffer: one digit at a time */
            unsigned d = (unsigned)*p - '0';
            if (d > 9) return -1;
            uint64_t value = d;
            p++;
            if (d != 0) {
                while ((d = (unsigned)*p - '0') <= 9) {
                    value = value * 10 + d;
                    if (value > 0xFFFFFFFFULL) return -1;
                    p++;
                }
            }
            out[n++] = (uint32_t)value;
        }
        if (*p == ',') {
            p++;
        } else {
            while (is_ws(*p)) p++;
            if (p == end) break;
            if (*p != ',') return -1; /* '.', 'e', a digit after a leading 0, or anything else */
            p++;
        }
        while (is_ws(*p)) p++;
    }
    *count = n;
    return close;
}

static PyObject *json_uint32_array(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "y*n", &view, &pos)) return NULL;
    const unsigned char *s = view.buf;
    const unsigned char *close = NULL;
    if (pos >= 0 && pos < view.len) close = memchr(s + pos, ']', (size_t)(view.len - pos));
    if (close == NULL) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    /* A flat array ends at the first ']'; each value takes at least two bytes ("d," or "d]"). Only
     * the pages written are touched, and shrinking the result afterwards does not copy it. */
    Py_ssize_t capacity = (close - (s + pos)) / 2 + 1;
    PyObject *packed = PyBytes_FromStringAndSize(NULL, capacity * 4);
    if (packed == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint32_t *values = (uint32_t *)PyBytes_AS_STRING(packed); /* ob_sval is 8-byte aligned */
    Py_ssize_t count = 0, end;
    Py_BEGIN_ALLOW_THREADS
    end = scan_uint32_array(s, view.len, close - s, pos, values, &count);
#if PY_BIG_ENDIAN
    for (Py_ssize_t i = 0; i < count; i++) values[i] = __builtin_bswap32(values[i]);
#endif
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (end < 0) {
        Py_DECREF(packed);
        Py_RETURN_NONE;
    }
    if (count != capacity && _PyBytes_Resize(&packed, count * 4) < 0) return NULL;
    return Py_BuildValue("(Nn)", packed, end);
}

/* ---- msgpack array of uint32 → le32 ------------------------------------------------------ */

/* The values of the msgpack array s[0..len) into out (room for the header's count); the count, or
 * -1 unless the buffer is exactly that array of unsigned ints below 2^32. */
static Py_ssize_t scan_msgpack_uint32(const unsigned char *s, Py_ssize_t len, Py_ssize_t count, Py_ssize_t at,
                                      uint32_t *out) {
    const unsigned char *p = s + at, *end = s + len;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (p >= end) return -1;
        unsigned char b = *p;
        if (b <= 0x7f) {
            out[i] = b;
            p += 1;
        } else if (b == 0xcc) {
            if (end - p < 2) return -1;
            out[i] = p[1];
            p += 2;
        } else if (b == 0xcd) {
            if (end - p < 3) return -1;
            out[i] = (uint32_t)p[1] << 8 | p[2];
            p += 3;
        } else if (b == 0xce) {
            if (end - p < 5) return -1;
            out[i] = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
            p += 5;
        } else {
            return -1;
        }
    }
    return p == end ? count : -1;
}

static PyObject *msgpack_uint32_array(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *s = view.buf;
    Py_ssize_t len = view.len, count = -1, at = 0;
    if (len >= 1 && s[0] >= 0x90 && s[0] <= 0x9f) {
        count = s[0] & 0x0f;
        at = 1;
    } else if (len >= 3 && s[0] == 0xdc) {
        count = (Py_ssize_t)s[1] << 8 | s[2];
        at = 3;
    } else if (len >= 5 && s[0] == 0xdd) {
        count = (Py_ssize_t)((uint32_t)s[1] << 24 | (uint32_t)s[2] << 16 | (uint32_t)s[3] << 8 | s[4]);
        at = 5;
    }
    /* Each value takes at least one byte: a count beyond the bytes left is truncated. */
    if (count < 0 || count > len - at) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    PyObject *packed = PyBytes_FromStringAndSize(NULL, count * 4);
    if (packed == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint32_t *values = (uint32_t *)PyBytes_AS_STRING(packed);
    Py_ssize_t got;
    Py_BEGIN_ALLOW_THREADS
    got = scan_msgpack_uint32(s, len, count, at, values);
#if PY_BIG_ENDIAN
    for (Py_ssize_t i = 0; i < count; i++) values[i] = __builtin_bswap32(values[i]);
#endif
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (got < 0) {
        Py_DECREF(packed);
        Py_RETURN_NONE;
    }
    return packed;
}

/* ---- the index's leading run of present keys ---------------------------------------------- */

/* dict_prefix(young, old, keys, limit) -> (values, done): values of keys[0..] while present, a key
 * found in ``old`` moving to ``young``; stops at the first absent key or the end (done = True) or
 * once a promotion makes len(young) reach ``limit`` (done = False, even at the last key: the caller
 * rotates, then continues after the values). */
static PyObject *map_prefix(U64Map *young, U64Map *old, PyObject *keys, Py_ssize_t limit);

static PyObject *dict_prefix(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *young, *old, *keys;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OOO!n", &young, &old, &PyList_Type, &keys, &limit)) return NULL;
    if (U64Map_Check(young) && U64Map_Check(old)) return map_prefix((U64Map *)young, (U64Map *)old, keys, limit);
    if (!PyDict_Check(young) || !PyDict_Check(old)) {
        PyErr_SetString(PyExc_TypeError, "dict_prefix takes two dicts or two U64Maps");
        return NULL;
    }
    PyObject *values = PyList_New(0);
    if (values == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    int done = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        PyObject *value = PyDict_GetItemWithError(young, key); /* borrowed */
        if (value == NULL) {
            if (PyErr_Occurred()) goto fail;
            value = PyDict_GetItemWithError(old, key);
            if (value == NULL) {
                if (PyErr_Occurred()) goto fail;
                break;
            }
            Py_INCREF(value);
            if (PyDict_SetItem(young, key, value) < 0 || PyDict_DelItem(old, key) < 0 ||
                PyList_Append(values, value) < 0) {
                Py_DECREF(value);
                goto fail;
            }
            Py_DECREF(value);
            if (PyDict_GET_SIZE(young) >= limit) {
                done = 0; /* even after the last key: the caller rotates */
                break;
            }
            continue;
        }
        if (PyList_Append(values, value) < 0) goto fail;
    }
    return Py_BuildValue("(NO)", values, done ? Py_True : Py_False);
fail:
    Py_DECREF(values);
    return NULL;
}

/* Appends the run (value, count) to the list out: 0, or -1 with an exception. */
static int append_run(PyObject *out, PyObject *value, Py_ssize_t count) {
    PyObject *run = Py_BuildValue("(On)", value, count);
    int failed = run == NULL || PyList_Append(out, run) < 0;
    Py_XDECREF(run);
    return failed ? -1 : 0;
}

/* One key of the prefix walk on U64Maps: 1 and *value (borrowed, held by young) when present
 * (a key found in old moves to young), 0 at an absent key, -1 on error. */
static inline int prefix_step(U64Map *young, U64Map *old, PyObject *key_obj, PyObject **value) {
    uint64_t key;
    if (u64_key(key_obj, &key) < 0) return -1;
    U64Slot *s = u64map_find(young, key);
    if (s->value != NULL) {
        *value = s->value;
        return 1;
    }
    if (old->used == 0) return 0;
    s = u64map_find(old, key);
    if (s->value == NULL) return 0;
    PyObject *taken = u64map_take(old, s); /* the reference old held */
    int failed = u64map_set(young, key, taken) < 0;
    Py_DECREF(taken); /* young took its own reference */
    if (failed) return -1;
    *value = taken;
    return 1;
}

static int check_maps(U64Map *young, U64Map *old) {
    if (young->slots == NULL || old->slots == NULL) {
        PyErr_SetString(PyExc_ValueError, "dict_prefix: a cleared U64Map");
        return -1;
    }
    return 0;
}

/* dict_prefix on U64Maps: no Python object is read but the key ints. The values list is sized
 * for every key up front and cut to the run found. */
static PyObject *map_prefix(U64Map *young, U64Map *old, PyObject *keys, Py_ssize_t limit) {
    if (check_maps(young, old) < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys), found = 0;
    PyObject *values = PyList_New(n);
    if (values == NULL) return NULL;
    int done = 1;
    for (Py_ssize_t i = 0; i < U64MAP_PREFETCH_AHEAD && i < n; i++) u64map_prefetch(young, PyList_GET_ITEM(keys, i));
    for (; found < n; found++) {
        if (found + U64MAP_PREFETCH_AHEAD < n) u64map_prefetch(young, PyList_GET_ITEM(keys, found + U64MAP_PREFETCH_AHEAD));
        Py_ssize_t before = young->used;
        PyObject *value;
        int present = prefix_step(young, old, PyList_GET_ITEM(keys, found), &value);
        if (present < 0) goto fail;
        if (!present) break;
        Py_INCREF(value);
        PyList_SET_ITEM(values, found, value);
        if (young->used > before && young->used >= limit) {
            found++;
            done = 0; /* even after the last key: the caller rotates */
            break;
        }
    }
    Py_SET_SIZE(values, found); /* the rest was never filled */
    return Py_BuildValue("(NO)", values, done ? Py_True : Py_False);
fail:
    Py_SET_SIZE(values, found); /* the rest of the list was never filled */
    Py_DECREF(values);
    return NULL;
}

/* prefix_runs(young, old, keys, start, limit) -> (runs, end, done): the walk of dict_prefix from
 * keys[start], run-length encoded as [(value, count), ...] of consecutive equal values, and the
 * index after the last key walked. U64Maps only. No list of a value per key is built: a long
 * prompt's lookup touches its keys and the slots, nothing else. */
static PyObject *prefix_runs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *young_obj, *old_obj, *keys;
    Py_ssize_t start, limit;
    if (!PyArg_ParseTuple(args, "O!O!O!nn", &U64Map_Type, &young_obj, &U64Map_Type, &old_obj, &PyList_Type, &keys,
                          &start, &limit))
        return NULL;
    U64Map *young = (U64Map *)young_obj, *old = (U64Map *)old_obj;
    if (check_maps(young, old) < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys), i = start < 0 ? 0 : start, run_start = i;
    PyObject *out = PyList_New(0), *current = NULL; /* current: the open run's value (owned) */
    if (out == NULL) return NULL;
    int done = 1;
    for (Py_ssize_t j = i; j < i + U64MAP_PREFETCH_AHEAD && j < n; j++) u64map_prefetch(young, PyList_GET_ITEM(keys, j));
    for (Py_ssize_t j = i + U64MAP_PREFETCH_AHEAD; j < i + 2 * U64MAP_PREFETCH_AHEAD && j < n; j++)
        __builtin_prefetch(PyList_GET_ITEM(keys, j));
    for (; i < n; i++) {
        /* The key ints of a prompt sent earlier are scattered over the heap: ask for the int
         * twice as far ahead as its slot, which needs the int's value. */
        if (i + 2 * U64MAP_PREFETCH_AHEAD < n) __builtin_prefetch(PyList_GET_ITEM(keys, i + 2 * U64MAP_PREFETCH_AHEAD));
        if (i + U64MAP_PREFETCH_AHEAD < n) u64map_prefetch(young, PyList_GET_ITEM(keys, i + U64MAP_PREFETCH_AHEAD));
        Py_ssize_t before = young->used;
        PyObject *value;
        int present = prefix_step(young, old, PyList_GET_ITEM(keys, i), &value);
        if (present < 0) goto fail;
        if (!present) break;
        if (current != NULL && value != current) {
            int same = PyObject_RichCompareBool(value, current, Py_EQ);
            if (same < 0) goto fail;
            if (!same) {
                if (append_run(out, current, i - run_start) < 0) goto fail;
                Py_CLEAR(current);
            }
        }
        if (current == NULL) {
            current = Py_NewRef(value);
            run_start = i;
        }
        if (young->used > before && young->used >= limit) {
            i++;
            done = 0; /* even after the last key: the caller rotates */
            break;
        }
    }
    if (current != NULL) {
        if (append_run(out, current, i - run_start) < 0) goto fail;
        Py_CLEAR(current);
    }
    return Py_BuildValue("(NnO)", out, i, done ? Py_True : Py_False);
fail:
    Py_XDECREF(current);
    Py_DECREF(out);
    return NULL;
}

/* remap(target, keys, values, mapping): for each key with mapping[value] present, target[key] =
 * mapping[value], or del target[key] when that is None. Returns how many keys were touched. */
static PyObject *remap(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *target, *keys, *values, *mapping;
    if (!PyArg_ParseTuple(args, "OO!O!O!", &target, &PyList_Type, &keys, &PyList_Type, &values, &PyDict_Type,
                          &mapping))
        return NULL;
    int table = U64Map_Check(target);
    if (!table && !PyDict_Check(target)) {
        PyErr_SetString(PyExc_TypeError, "remap's target is a dict or a U64Map");
        return NULL;
    }
    if (table && ((U64Map *)target)->slots == NULL) {
        PyErr_SetString(PyExc_ValueError, "remap: a cleared U64Map");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys), touched = 0;
    if (PyList_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_ValueError, "keys and values differ in length");
        return NULL;
    }
    if (table) {
        for (Py_ssize_t i = 0; i < U64MAP_PREFETCH_AHEAD && i < n; i++)
            u64map_prefetch((U64Map *)target, PyList_GET_ITEM(keys, i));
    }
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(keys) && i < PyList_GET_SIZE(values); i++) {
        /* a deletion's finalizer may shrink the lists: ahead is re-checked against their size */
        if (table && i + U64MAP_PREFETCH_AHEAD < PyList_GET_SIZE(keys))
            u64map_prefetch((U64Map *)target, PyList_GET_ITEM(keys, i + U64MAP_PREFETCH_AHEAD));
        PyObject *new = PyDict_GetItemWithError(mapping, PyList_GET_ITEM(values, i)); /* borrowed */
        if (new == NULL) {
            if (PyErr_Occurred()) return NULL;
            continue;
        }
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (table) {
            U64Map *m = (U64Map *)target;
            uint64_t k;
            if (u64_key(key, &k) < 0) return NULL;
            if (new == Py_None) {
                U64Slot *s = u64map_find(m, k);
                if (s->value != NULL) Py_DECREF(u64map_take(m, s));
            } else if (u64map_set(m, k, new) < 0) {
                return NULL;
            }
        } else if (new == Py_None) {
            if (PyDict_DelItem(target, key) < 0) {
                if (!PyErr_ExceptionMatches(PyExc_KeyError)) return NULL;
                PyErr_Clear();
            }
        } else if (PyDict_SetItem(target, key, new) < 0) {
            return NULL;
        }
        touched++;
    }
    return PyLong_FromSsize_t(touched);
}

/* runs(values) -> [(value, count), ...]: consecutive equal values, run-length encoded. */
static PyObject *runs(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "runs expects a list");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(arg), start = 0;
    for (Py_ssize_t i = 1; i <= n; i++) {
        if (i < n) {
            int same = PyObject_RichCompareBool(PyList_GET_ITEM(arg, i), PyList_GET_ITEM(arg, start), Py_EQ);
            if (same < 0) goto fail;
            if (same) continue;
        }
        if (append_run(out, PyList_GET_ITEM(arg, start), i - start) < 0) goto fail;
        start = i;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* ---- common prefix of two buffers --------------------------------------------------------- */

/* common_prefix(a, a_start, b, b_start) -> n: how many bytes a[a_start:] and b[b_start:] have in
 * common from their start (memcmp a page at a time, then byte by byte in the page that differs). */
static PyObject *common_prefix(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer a, b;
    Py_ssize_t a_start, b_start;
    if (!PyArg_ParseTuple(args, "y*ny*n", &a, &a_start, &b, &b_start)) return NULL;
    Py_ssize_t n = 0;
    if (a_start >= 0 && b_start >= 0 && a_start <= a.len && b_start <= b.len) {
        const unsigned char *p = (const unsigned char *)a.buf + a_start, *q = (const unsigned char *)b.buf + b_start;
        Py_ssize_t limit = a.len - a_start < b.len - b_start ? a.len - a_start : b.len - b_start;
        if (p == q) { /* one buffer against itself: a repeated prompt's tokens are the recent ones */
            n = limit;
        } else {
            Py_BEGIN_ALLOW_THREADS
            while (n + 4096 <= limit && memcmp(p + n, q + n, 4096) == 0) n += 4096;
            while (n < limit && p[n] == q[n]) n++;
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return PyLong_FromSsize_t(n);
}

static PyMethodDef methods[] = {
    {"remap", remap, METH_VARARGS,
     "target[key] = mapping[value] (del when None) for each key whose value the mapping holds."},
    {"runs", runs, METH_O, "[(value, count), ...] of consecutive equal values of a list."},
    {"prefix_runs", prefix_runs, METH_VARARGS,
     "dict_prefix's walk on U64Maps from keys[start], as (value, count) runs: (runs, end, done)."},
    {"common_prefix", common_prefix, METH_VARARGS,
     "How many bytes a[a_start:] and b[b_start:] have in common from their start."},
    {"dict_prefix", dict_prefix, METH_VARARGS,
     "(values, done) of the leading run of keys present in young or old (old hits move to young)."},
    {"json_uint32_array", json_uint32_array, METH_VARARGS,
     "(le32 bytes, index of ']') of a JSON array of integers in [0, 2^32) at buf[pos], or None."},
    {"msgpack_uint32_array", msgpack_uint32_array, METH_O,
     "le32 bytes of a buffer holding exactly one msgpack array of uint32 values, or None."},
    {"xxh64_chain", xxh64_chain, METH_VARARGS, "llm-d's xxh64 request-key chain (no extras)."},
    {"cbor_fnv_chain", cbor_fnv_chain, METH_VARARGS, "llm-d's cbor-fnv request-key chain (no extras)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&U64Map_Type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&U64Map_Type);
    if (PyModule_AddObject(m, "U64Map", (PyObject *)&U64Map_Type) < 0) {
        Py_DECREF(&U64Map_Type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
