/* U64Map: a hash table from uint64 keys, stored inline, to Python objects (the index's
 * generations; ppc_extproc/_u64map.c defines the type, _native.c's bulk calls probe it here).
 *
 * Open addressing with linear probing over 16-byte slots {key, value}; value NULL marks an empty
 * slot; deletion shifts the following run back (no tombstones: Knuth, TAOCP vol. 3, 6.4,
 * Algorithm R). A key's home slot is the top bits of key * 2^64/phi (Fibonacci hashing), so
 * sequential keys spread too. At most 3/4 of the slots are used; a probe reads no Python object. */
#ifndef PPC_U64MAP_H
#define PPC_U64MAP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    uint64_t key;
    PyObject *value; /* NULL: empty */
} U64Slot;

typedef struct {
    PyObject_HEAD
    U64Slot *slots;
    size_t mask;  /* capacity - 1; capacity is a power of two */
    int shift;    /* 64 - log2(capacity) */
    Py_ssize_t used;
    size_t cursor; /* where popitem looks first */
} U64Map;

extern PyTypeObject U64Map_Type;

#define U64Map_Check(op) (Py_TYPE(op) == &U64Map_Type)

static inline size_t u64map_home(const U64Map *m, uint64_t key) {
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> m->shift);
}

/* The slot holding key, or the empty slot where it would go. */
static inline U64Slot *u64map_find(const U64Map *m, uint64_t key) {
    size_t i = u64map_home(m, key);
    for (;;) {
        U64Slot *s = &m->slots[i];
        if (s->value == NULL || s->key == key) return s;
        i = (i + 1) & m->mask;
    }
}

/* A Python int in [0, 2^64) read from CPython 3.11's layout (sign in ob_size, 30-bit digits):
 * 1 and *out set, or 0 (another int or type, or another layout) with no exception set. */
static inline int u64_key_fast(PyObject *obj, uint64_t *out) {
#if PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
    if (PyLong_CheckExact(obj)) {
        const digit *d = ((PyLongObject *)obj)->ob_digit;
        switch (Py_SIZE(obj)) {
            case 0: *out = 0; return 1;
            case 1: *out = d[0]; return 1;
            case 2: *out = (uint64_t)d[0] | (uint64_t)d[1] << 30; return 1;
            case 3:
                if (d[2] < 16) {
                    *out = (uint64_t)d[0] | (uint64_t)d[1] << 30 | (uint64_t)d[2] << 60;
                    return 1;
                }
                break;
            default: break;
        }
    }
#else
    (void)obj;
    (void)out;
#endif
    return 0;
}

/* A Python int in [0, 2^64) as a key; TypeError / OverflowError otherwise. */
static inline int u64_key(PyObject *obj, uint64_t *out) {
    if (u64_key_fast(obj, out)) return 0;
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "U64Map keys are ints in [0, 2**64), not %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    uint64_t value = PyLong_AsUnsignedLongLong(obj);
    if (value == (uint64_t)-1 && PyErr_Occurred()) return -1;
    *out = value;
    return 0;
}

/* Bulk probes of a list of keys ask for the home slot of the key this many places ahead, so the
 * table's cache misses overlap instead of queueing one behind the other. */
#define U64MAP_PREFETCH_AHEAD 12

static inline void u64map_prefetch_key(const U64Map *m, uint64_t key) {
    __builtin_prefetch(&m->slots[u64map_home(m, key)]);
}

static inline void u64map_prefetch(const U64Map *m, PyObject *key_obj) {
    uint64_t key;
    if (u64_key_fast(key_obj, &key)) u64map_prefetch_key(m, key);
}

/* Sets key to value (a new reference is taken). 0, or -1 with an exception (no memory). */
int u64map_set(U64Map *m, uint64_t key, PyObject *value);
/* Removes the occupied slot s; returns its value (the reference the table held). */
PyObject *u64map_take(U64Map *m, U64Slot *s);

#endif
