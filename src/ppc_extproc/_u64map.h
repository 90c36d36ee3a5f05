/* U64Map: a hash table from uint64 keys, stored inline, to Python objects (the index's
 * generations; ppc_extproc/_u64map.c defines the type, _native.c's bulk calls probe it here).
 *
 * Open addressing with linear probing over 16-byte slots {key, value}; value NULL marks an empty
 * slot; deletion shifts the following run back (no tombstones: Knuth, TAOCP vol. 3, 6.4,
 * Algorithm R). A key's home slot is the top bits of key * 2^64/phi (Fibonacci hashing), so
 * sequential keys spread too. At most 3/4 of the slots are used; a probe reads no Python object.
 *
 * Growth doubles the slots, and the entries of the array it replaces ("draining") move over a few
 * slots per insertion, in slot order (Go's maps spread their growth the same way): a key is in
 * exactly one of the two arrays, and draining's slots below drain_at are empty. Moving them all
 * at once held the caller for 0.14 s at 3M keys. The doubled array of a large table is allocated
 * ("next") once 5/8 of the slots are used, and its pages are made present a slice per insertion
 * until the growth at 3/4, so the insertions after it do not each fault a fresh page in. */
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
    Py_ssize_t used; /* entries in slots and draining */
    size_t cursor; /* where popitem looks first in slots */
    U64Slot *draining; /* the slots before the last growth, while entries remain there; else NULL */
    size_t draining_mask;
    int draining_shift;
    size_t drain_at; /* draining's slots below this are empty, and hold no key's home */
    size_t drain_step; /* draining's slots moved per insertion */
    uintptr_t drained_released; /* draining's pages below this address were given back */
    U64Slot *next; /* the array of the next growth, prepared ahead (large tables); else NULL */
    size_t next_ready; /* bytes of next whose pages are present */
    size_t planned; /* the most keys its owner will insert (plan_for); 0: not said */
} U64Map;

extern PyTypeObject U64Map_Type;

#define U64Map_Check(op) (Py_TYPE(op) == &U64Map_Type)

static inline size_t u64_home(uint64_t key, int shift) { return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> shift); }

/* In one array: the slot holding key, or the empty slot where it would go. */
static inline U64Slot *u64_probe(U64Slot *slots, size_t mask, int shift, uint64_t key) {
    size_t i = u64_home(key, shift);
    for (;;) {
        U64Slot *s = &slots[i];
        if (s->value == NULL || s->key == key) return s;
        i = (i + 1) & mask;
    }
}

/* The slot holding key (in slots, or in draining while the table grows), or the empty slot of
 * slots where it would go. */
static inline U64Slot *u64map_find(const U64Map *m, uint64_t key) {
    U64Slot *s = u64_probe(m->slots, m->mask, m->shift, key);
    if (s->value == NULL && m->draining != NULL && u64_home(key, m->draining_shift) >= m->drain_at) {
        U64Slot *d = u64_probe(m->draining, m->draining_mask, m->draining_shift, key);
        if (d->value != NULL) return d;
    }
    return s;
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

/* Always inlined: GCC 12 finds a helper that only prefetches "pure" once it is too large to inline
 * early, and then deletes its calls, since their result is unused. */
#define U64MAP_PREFETCH_HELPER static inline __attribute__((always_inline)) void

U64MAP_PREFETCH_HELPER u64map_prefetch_key(const U64Map *m, uint64_t key) {
    __builtin_prefetch(&m->slots[u64_home(key, m->shift)]);
    if (m->draining != NULL) { /* the slot u64map_find may probe there */
        size_t home = u64_home(key, m->draining_shift);
        if (home >= m->drain_at) __builtin_prefetch(&m->draining[home]);
    }
}

U64MAP_PREFETCH_HELPER u64map_prefetch(const U64Map *m, PyObject *key_obj) {
    uint64_t key;
    if (u64_key_fast(key_obj, &key)) u64map_prefetch_key(m, key);
}

/* Sets key to value (a new reference is taken). 0, or -1 with an exception (no memory). */
int u64map_set(U64Map *m, uint64_t key, PyObject *value);
/* Removes the occupied slot s (u64map_find's); returns its value (the reference the table held). */
PyObject *u64map_take(U64Map *m, U64Slot *s);

#endif
