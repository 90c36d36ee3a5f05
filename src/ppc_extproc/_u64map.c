/* U64Map: the mapping subset the index's two-generation LRU uses (ppc_extproc/index/lru.py),
 * over uint64 keys stored inline (layout and probing: _u64map.h).
 *
 *   m[k], m[k] = v, del m[k], k in m, len(m), iter(m), get(k, default=None), pop(k[, default]),
 *   popitem(), update(mapping or pairs), copy(), keys() / values() / items() (lists), clear(),
 *   fill(keys, value) (every key set to one value), get_many(keys) (values or None),
 *   swap_many and drop_some (the LRU's bulk writes), plan_for(n) (the most keys it will hold).
 *
 * Keys are ints in [0, 2^64) (TypeError / OverflowError otherwise); values any object, held by
 * reference and visited by the garbage collector (the table is tracked from the first value that
 * may be in a cycle on). Iteration order is the table's, not insertion. */
#include "_u64map.h"

#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#endif

#define MIN_CAPACITY 8
/* Draining's slots visited per insertion, at the least. Growth comes at 3/4 of C slots used and
 * the next one 3/4 * C insertions later at the earliest, so any step of 2 or more empties draining
 * first. A table told its final size (plan_for) takes larger steps when it would otherwise stop
 * with entries left to move: they would stay there, each found by two probes. */
#define DRAIN_STEP 8

/* Tables of at least this many slots prepare the array of their next growth, and give back the
 * pages of the one they drain as it empties. */
#define LARGE_CAPACITY (1 << 16)
/* Pages made present, or given back, per call at the least. */
#define POPULATE_MIN_BYTES (64 << 10)
#define RELEASE_MIN_BYTES (1 << 20)

static uintptr_t page_size(void) {
#ifdef __linux__
    static uintptr_t page = 0;
    if (page == 0) page = (uintptr_t)sysconf(_SC_PAGESIZE);
    return page;
#else
    return 4096;
#endif
}

/* An empty table of capacity slots (a power of two); the caller releases the arrays it held. */
static int alloc_slots(U64Map *m, size_t capacity) {
    U64Slot *slots = PyMem_Calloc(capacity, sizeof(U64Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    m->slots = slots;
    m->mask = capacity - 1;
    m->shift = 64 - __builtin_ctzll((unsigned long long)capacity);
    m->used = 0;
    m->cursor = 0;
    m->draining = NULL;
    m->draining_mask = 0;
    m->drain_at = 0;
    m->drained_released = 0;
    m->next = NULL;
    m->next_ready = 0;
    return 0;
}

/* Releases every value of an array of capacity slots from slot from on (the others are empty),
 * then the array. */
static void release(U64Slot *slots, size_t capacity, size_t from) {
    if (slots == NULL) return;
    for (size_t i = from; i < capacity; i++) Py_XDECREF(slots[i].value);
    PyMem_Free(slots);
}

/* Empties the occupied slot s of one array: each follower whose home is not between the hole and
 * itself moves back into the hole. */
static void remove_at(U64Slot *slots, size_t mask, int shift, U64Slot *s) {
    size_t hole = (size_t)(s - slots), j = hole;
    for (;;) {
        j = (j + 1) & mask;
        U64Slot *next = &slots[j];
        if (next->value == NULL) break;
        size_t home = u64_home(next->key, shift);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            slots[hole] = *next;
            hole = j;
        }
    }
    slots[hole].value = NULL;
}

static void end_drain(U64Map *m) {
    PyMem_Free(m->draining);
    m->draining = NULL;
    m->draining_mask = 0;
    m->drain_at = 0;
    m->drained_released = 0;
}

/* Gives back the pages of a large draining array's emptied slots, a slice at a time: unmapping
 * them all when it ends took 4.5 ms for 64 MB. Such pages read as zeros, that is empty slots, and
 * no probe starts below drain_at. The page holding the array's first byte stays: the allocator
 * keeps its own words just before it. */
static void release_drained(U64Map *m) {
#ifdef __linux__
    if (m->draining_mask + 1 < LARGE_CAPACITY) return;
    uintptr_t page = page_size(), first = ((uintptr_t)m->draining + page - 1) & ~(page - 1);
    uintptr_t from = m->drained_released > first ? m->drained_released : first;
    uintptr_t to = (uintptr_t)&m->draining[m->drain_at] & ~(page - 1);
    if (to >= from + RELEASE_MIN_BYTES && madvise((void *)from, to - from, MADV_DONTNEED) == 0) m->drained_released = to;
#else
    (void)m;
#endif
}

/* Moves the entries of draining's next budget slots (or more, to the end of a run) to slots, in
 * slot order. A run starting at drain_at moves whole and leaves its slots empty: nothing before it
 * is left, and no entry after it has its home inside it, so no probe path crosses it. */
static void drain(U64Map *m, size_t budget) {
    while (m->draining != NULL && budget > 0) {
        U64Slot *draining = m->draining;
        size_t start = m->drain_at, end = start;
        while (end <= m->draining_mask && draining[end].value != NULL) end++;
        for (size_t i = start; i < end; i++) {
            *u64_probe(m->slots, m->mask, m->shift, draining[i].key) = draining[i];
            draining[i].value = NULL;
        }
        size_t done = end > start ? end - start : 1;
        budget = budget > done ? budget - done : 0;
        m->drain_at = start + done;
        if (m->drain_at > m->draining_mask) end_drain(m);
    }
    if (m->draining != NULL) release_drained(m);
}

/* Makes the pages of [start, start + length) present, zero-filled, where the system can: what
 * the first write to each would otherwise fault in. The contents are left as they are. */
static void populate(void *start, size_t length) {
#ifdef __linux__
    uintptr_t page = page_size();
    /* Outward to whole pages: each holds part of the range, so it is mapped, and a slice's
     * boundary page is not left out between two calls. */
    uintptr_t from = (uintptr_t)start & ~(page - 1), to = ((uintptr_t)start + length + page - 1) & ~(page - 1);
    if (length > 0) (void)madvise((void *)from, to - from, MADV_POPULATE_WRITE); /* a hint: errors ignored */
#else
    (void)start;
    (void)length;
#endif
}

/* Whether a table told its final size (plan_for) will not grow past capacity slots. */
static inline int planned_within(const U64Map *m, size_t capacity) { return m->planned != 0 && m->planned * 4 <= capacity * 3; }

/* Frees the array prepared for the next growth, if any. */
static void drop_next(U64Map *m) {
    PyMem_Free(m->next);
    m->next = NULL;
    m->next_ready = 0;
}

/* For each insertion into a large table from 5/8 of its slots used to the growth at 3/4 (the
 * caller checks): allocates next, then makes its pages present in proportion to the insertions
 * made since. A failed allocation is left to grow. */
static void prepare(U64Map *m) {
    size_t capacity = m->mask + 1, used = (size_t)m->used;
    if (planned_within(m, capacity)) return; /* it will not grow again */
    size_t bytes = 2 * capacity * sizeof(U64Slot);
    if (m->next == NULL) {
        m->next = PyMem_Calloc(2 * capacity, sizeof(U64Slot));
        m->next_ready = 0;
        if (m->next == NULL) return;
    }
    /* 2 * capacity slots' bytes over the capacity / 8 insertions from 5/8 to 3/4 full */
    size_t since = used - capacity * 5 / 8, due = since * 16 * sizeof(U64Slot);
    if (due > bytes) due = bytes;
    if (due >= m->next_ready + POPULATE_MIN_BYTES || (due == bytes && m->next_ready < bytes)) {
        populate((char *)m->next + m->next_ready, due - m->next_ready);
        m->next_ready = due;
    }
}

/* Doubles the slots (next, when prepared); what they held becomes draining. m unchanged on
 * failure. */
static int grow(U64Map *m) {
    if (m->draining != NULL) drain(m, SIZE_MAX); /* not reached with DRAIN_STEP >= 2 */
    size_t capacity = (m->mask + 1) * 2;
    U64Slot *slots = m->next != NULL ? m->next : PyMem_Calloc(capacity, sizeof(U64Slot));
    m->next = NULL;
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    m->draining = m->slots;
    m->draining_mask = m->mask;
    m->draining_shift = m->shift;
    m->drain_at = 0;
    m->drained_released = 0;
    m->drain_step = DRAIN_STEP;
    if (m->planned != 0) { /* done by the last planned insertion */
        size_t left = m->planned > (size_t)m->used ? m->planned - (size_t)m->used : 1; /* this one included */
        size_t step = (m->mask + left) / left; /* ceil(old capacity / left) */
        if (step > m->drain_step) m->drain_step = step;
    }
    m->slots = slots;
    m->mask = capacity - 1;
    m->shift = 64 - __builtin_ctzll((unsigned long long)capacity);
    m->cursor = 0;
    return 0;
}

/* Whether a value can take part in a reference cycle. The index's values are int masks and tuples
 * of ints, which cannot: a table holding only those stays untracked by the garbage collector
 * (as a dict of ints does), so a collection does not walk its millions of slots. */
static inline int may_cycle(PyObject *value) {
    if (PyLong_CheckExact(value) || !PyObject_IS_GC(value)) return 0;
    if (PyTuple_CheckExact(value)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(value); i++) {
            if (!PyLong_CheckExact(PyTuple_GET_ITEM(value, i))) return 1;
        }
        return 0;
    }
    return 1;
}

int u64map_set(U64Map *m, uint64_t key, PyObject *value) {
    if (!PyObject_GC_IsTracked((PyObject *)m) && may_cycle(value)) PyObject_GC_Track(m);
    U64Slot *s = u64map_find(m, key);
    if (s->value != NULL) {
        PyObject *previous = s->value;
        Py_INCREF(value);
        s->value = value;
        Py_DECREF(previous); /* last: a finalizer may change the table */
        return 0;
    }
    int moved = m->draining != NULL;
    if (moved) drain(m, m->drain_step);
    if (m->mask + 1 >= LARGE_CAPACITY && (size_t)m->used * 8 >= (m->mask + 1) * 5 && m->draining == NULL) prepare(m);
    if ((size_t)(m->used + 1) * 4 > (m->mask + 1) * 3) {
        if (grow(m) < 0) return -1;
        drain(m, m->drain_step);
        moved = 1;
    }
    if (moved) s = u64_probe(m->slots, m->mask, m->shift, key); /* the key is in neither array */
    Py_INCREF(value);
    s->key = key;
    s->value = value;
    m->used++;
    return 0;
}

PyObject *u64map_take(U64Map *m, U64Slot *s) {
    PyObject *value = s->value;
    uintptr_t at = (uintptr_t)s, draining = (uintptr_t)m->draining;
    if (m->draining != NULL && at >= draining && at < draining + (m->draining_mask + 1) * sizeof(U64Slot)) {
        remove_at(m->draining, m->draining_mask, m->draining_shift, s);
    } else {
        remove_at(m->slots, m->mask, m->shift, s);
    }
    m->used--;
    return value;
}

/* The slot popitem empties next: draining's first entry while there is one, else the first in
 * slots from the cursor on. The table holds at least one entry. */
static U64Slot *next_out(U64Map *m) {
    while (m->draining != NULL) {
        U64Slot *d = &m->draining[m->drain_at];
        if (d->value != NULL) return d;
        if (m->drain_at++ == m->draining_mask) end_drain(m);
    }
    size_t i = m->cursor & m->mask;
    while (m->slots[i].value == NULL) i = (i + 1) & m->mask;
    m->cursor = i; /* a shift after the removal may refill this slot: look here next */
    return &m->slots[i];
}

/* Empties the table, releasing the values after it is consistent again. */
static int reset(U64Map *m) {
    U64Slot *slots = m->slots, *draining = m->draining, *next = m->next;
    size_t capacity = m->mask + 1, draining_capacity = m->draining_mask + 1, drain_at = m->drain_at;
    if (alloc_slots(m, MIN_CAPACITY) < 0) return -1;
    PyMem_Free(next);
    release(slots, capacity, 0);
    release(draining, draining_capacity, drain_at);
    return 0;
}

/* ---- type slots ---------------------------------------------------------------------------- */

static int fill_from(U64Map *m, PyObject *source);

static PyObject *u64map_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *source = NULL;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "U64Map takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "U64Map", 0, 1, &source)) return NULL;
    U64Map *m = (U64Map *)type->tp_alloc(type, 0);
    if (m == NULL) return NULL;
    PyObject_GC_UnTrack(m); /* tracked once it holds a value that may be in a cycle */
    if (alloc_slots(m, MIN_CAPACITY) < 0 || (source != NULL && fill_from(m, source) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return (PyObject *)m;
}

static int u64map_traverse(U64Map *m, visitproc visit, void *arg) {
    if (m->slots != NULL) {
        for (size_t i = 0; i <= m->mask; i++) Py_VISIT(m->slots[i].value);
    }
    if (m->draining != NULL) {
        for (size_t i = m->drain_at; i <= m->draining_mask; i++) Py_VISIT(m->draining[i].value);
    }
    return 0;
}

static int u64map_clear(U64Map *m) {
    U64Slot *slots = m->slots, *draining = m->draining;
    size_t capacity = m->mask + 1, draining_capacity = m->draining_mask + 1, drain_at = m->drain_at;
    drop_next(m);
    m->slots = m->draining = NULL;
    m->mask = m->draining_mask = m->drain_at = 0;
    m->drained_released = 0;
    m->used = 0;
    release(slots, capacity, 0);
    release(draining, draining_capacity, drain_at);
    return 0;
}

static void u64map_dealloc(U64Map *m) {
    PyObject_GC_UnTrack(m);
    u64map_clear(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

/* tp_clear leaves no table: every entry point that touches one checks it here. */
static int ready(U64Map *m) {
    if (m->slots != NULL) return 0;
    return alloc_slots(m, MIN_CAPACITY);
}

static Py_ssize_t u64map_length(U64Map *m) { return m->used; }

static PyObject *lookup(U64Map *m, PyObject *key_obj, int *error) {
    uint64_t key;
    *error = 0;
    if (u64_key(key_obj, &key) < 0 || ready(m) < 0) {
        *error = 1;
        return NULL;
    }
    return u64map_find(m, key)->value; /* borrowed, NULL when absent */
}

static PyObject *u64map_subscript(U64Map *m, PyObject *key_obj) {
    int error;
    PyObject *value = lookup(m, key_obj, &error);
    if (error) return NULL;
    if (value == NULL) {
        PyErr_SetObject(PyExc_KeyError, key_obj);
        return NULL;
    }
    Py_INCREF(value);
    return value;
}

static int u64map_ass_subscript(U64Map *m, PyObject *key_obj, PyObject *value) {
    uint64_t key;
    if (u64_key(key_obj, &key) < 0 || ready(m) < 0) return -1;
    if (value != NULL) return u64map_set(m, key, value);
    U64Slot *s = u64map_find(m, key);
    if (s->value == NULL) {
        PyErr_SetObject(PyExc_KeyError, key_obj);
        return -1;
    }
    Py_DECREF(u64map_take(m, s));
    return 0;
}

static int u64map_contains(U64Map *m, PyObject *key_obj) {
    int error;
    PyObject *value = lookup(m, key_obj, &error);
    return error ? -1 : value != NULL;
}

/* The i-th slot of draining (part 0, from drain_at on: below it, given-back pages) or of slots
 * (part 1); NULL past the end. */
static inline U64Slot *slot_of(const U64Map *m, int part, size_t i) {
    U64Slot *slots = part ? m->slots : m->draining;
    static U64Slot empty;
    if (slots == NULL || i > (part ? m->mask : m->draining_mask)) return NULL;
    return part || i >= m->drain_at ? &slots[i] : &empty;
}

/* keys (what 0), values (1) or (key, value) pairs (2), as a new list. */
static PyObject *listing(U64Map *m, int what) {
    PyObject *out = PyList_New(m->used);
    if (out == NULL || m->slots == NULL) return out;
    Py_ssize_t n = 0, size = PyList_GET_SIZE(out);
    /* Bounds re-read at each step: an allocation may run a finalizer that changes the table. */
    U64Slot *s;
    for (int part = 0; part < 2; part++)
    for (size_t i = 0; n < size && (s = slot_of(m, part, i)) != NULL; i++) {
        if (s->value == NULL) continue;
        PyObject *item;
        if (what == 1) {
            item = s->value;
            Py_INCREF(item);
        } else {
            PyObject *value = s->value;
            item = PyLong_FromUnsignedLongLong(s->key);
            if (item != NULL && what == 2) item = Py_BuildValue("(NO)", item, value);
            if (item == NULL) {
                Py_DECREF(out);
                return NULL;
            }
        }
        PyList_SET_ITEM(out, n++, item);
    }
    Py_SET_SIZE(out, n);
    return out;
}

static PyObject *u64map_iter(U64Map *m) {
    PyObject *keys = listing(m, 0);
    if (keys == NULL) return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyObject *u64map_repr(U64Map *m) { return PyUnicode_FromFormat("<U64Map of %zd keys>", m->used); }

/* ---- methods ------------------------------------------------------------------------------- */

static PyObject *m_get(U64Map *m, PyObject *const *args, Py_ssize_t nargs) {
    if (!_PyArg_CheckPositional("get", nargs, 1, 2)) return NULL;
    int error;
    PyObject *value = lookup(m, args[0], &error);
    if (error) return NULL;
    if (value == NULL) value = nargs > 1 ? args[1] : Py_None;
    Py_INCREF(value);
    return value;
}

static PyObject *m_pop(U64Map *m, PyObject *const *args, Py_ssize_t nargs) {
    if (!_PyArg_CheckPositional("pop", nargs, 1, 2)) return NULL;
    uint64_t key;
    if (u64_key(args[0], &key) < 0 || ready(m) < 0) return NULL;
    U64Slot *s = u64map_find(m, key);
    if (s->value != NULL) return u64map_take(m, s);
    if (nargs > 1) {
        Py_INCREF(args[1]);
        return args[1];
    }
    PyErr_SetObject(PyExc_KeyError, args[0]);
    return NULL;
}

static PyObject *m_popitem(U64Map *m, PyObject *unused) {
    (void)unused;
    if (m->used == 0) {
        PyErr_SetString(PyExc_KeyError, "popitem(): U64Map is empty");
        return NULL;
    }
    U64Slot *s = next_out(m);
    PyObject *key = PyLong_FromUnsignedLongLong(s->key);
    if (key == NULL) return NULL;
    PyObject *value = u64map_take(m, s);
    return Py_BuildValue("(NN)", key, value);
}

static int fill_from(U64Map *m, PyObject *source) {
    if (U64Map_Check(source)) {
        U64Map *other = (U64Map *)source;
        if (other == m) return 0;
        /* The source is re-read at each step: a finalizer run by a replaced value may change it. */
        U64Slot *at;
        for (int part = 0; part < 2; part++)
        for (size_t i = 0; (at = slot_of(other, part, i)) != NULL; i++) {
            U64Slot slot = *at;
            if (slot.value == NULL) continue;
            Py_INCREF(slot.value);
            int failed = u64map_set(m, slot.key, slot.value);
            Py_DECREF(slot.value);
            if (failed) return -1;
        }
        return 0;
    }
    if (PyDict_Check(source)) {
        PyObject *key_obj, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(source, &pos, &key_obj, &value)) {
            uint64_t key;
            if (u64_key(key_obj, &key) < 0) return -1;
            Py_INCREF(value);
            int failed = u64map_set(m, key, value);
            Py_DECREF(value);
            if (failed) return -1;
        }
        return 0;
    }
    PyObject *it = PyObject_GetIter(source);
    if (it == NULL) return -1;
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        PyObject *pair = PySequence_Fast(item, "U64Map.update takes a mapping or (key, value) pairs");
        Py_DECREF(item);
        if (pair == NULL) goto fail;
        uint64_t key;
        if (PySequence_Fast_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_ValueError, "U64Map.update takes (key, value) pairs");
            Py_DECREF(pair);
            goto fail;
        }
        if (u64_key(PySequence_Fast_GET_ITEM(pair, 0), &key) < 0 ||
            u64map_set(m, key, PySequence_Fast_GET_ITEM(pair, 1)) < 0) {
            Py_DECREF(pair);
            goto fail;
        }
        Py_DECREF(pair);
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
fail:
    Py_DECREF(it);
    return -1;
}

static PyObject *m_update(U64Map *m, PyObject *source) {
    if (ready(m) < 0 || fill_from(m, source) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *m_fill(U64Map *m, PyObject *const *args, Py_ssize_t nargs) {
    if (!_PyArg_CheckPositional("fill", nargs, 2, 2) || ready(m) < 0) return NULL;
    PyObject *keys = PySequence_Fast(args[0], "fill takes a sequence of keys");
    if (keys == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    PyObject *value = args[1];
    Py_INCREF(value);
    for (Py_ssize_t i = 0; i < U64MAP_PREFETCH_AHEAD && i < n; i++) u64map_prefetch(m, PySequence_Fast_GET_ITEM(keys, i));
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + U64MAP_PREFETCH_AHEAD < n) u64map_prefetch(m, PySequence_Fast_GET_ITEM(keys, i + U64MAP_PREFETCH_AHEAD));
        uint64_t key;
        if (u64_key(PySequence_Fast_GET_ITEM(keys, i), &key) < 0 || u64map_set(m, key, value) < 0) {
            Py_DECREF(value);
            Py_DECREF(keys);
            return NULL;
        }
    }
    Py_DECREF(value);
    Py_DECREF(keys);
    Py_RETURN_NONE;
}

static PyObject *m_get_many(U64Map *m, PyObject *arg) {
    if (ready(m) < 0) return NULL;
    PyObject *keys = PySequence_Fast(arg, "get_many takes a sequence of keys");
    if (keys == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    PyObject *out = PyList_New(n);
    if (out == NULL) goto fail;
    PyObject **items = PySequence_Fast_ITEMS(keys);
    for (Py_ssize_t i = 0; i < U64MAP_PREFETCH_AHEAD && i < n; i++) u64map_prefetch(m, items[i]);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + U64MAP_PREFETCH_AHEAD < n) u64map_prefetch(m, items[i + U64MAP_PREFETCH_AHEAD]);
        uint64_t key;
        if (u64_key(PySequence_Fast_GET_ITEM(keys, i), &key) < 0) goto fail;
        PyObject *value = u64map_find(m, key)->value;
        if (value == NULL) value = Py_None;
        Py_INCREF(value);
        PyList_SET_ITEM(out, i, value);
    }
    Py_DECREF(keys);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(keys);
    return NULL;
}

/* u64map_prefetch for swap_many's salted keys, in this table and in old. */
U64MAP_PREFETCH_HELPER prefetch_salted(const U64Map *m, const U64Map *old, PyObject *key_obj, uint64_t salt) {
    uint64_t key;
    if (!u64_key_fast(key_obj, &key)) return;
    key ^= salt;
    u64map_prefetch_key(m, key);
    if (old != NULL && old->used) u64map_prefetch_key(old, key);
}

/* swap_many(keys, values, start, old, limit, salt, previous) -> (stop, found): from keys[start],
 * key k = (keys[i] mod 2^64) ^ salt is set to values[i]; its previous value (this table's, else
 * popped from old, else None) is appended to previous. Stops after the write that brings the table
 * to limit keys (the caller rotates its generations there and goes on from stop). found: how many
 * appended values are not None. The LRU's set_many in one call per rotation. */
static PyObject *m_swap_many(U64Map *m, PyObject *const *args, Py_ssize_t nargs) {
    if (!_PyArg_CheckPositional("swap_many", nargs, 7, 7) || ready(m) < 0) return NULL;
    PyObject *keys_arg = args[0], *values_arg = args[1], *old_arg = args[3], *previous = args[6];
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    uint64_t salt = PyLong_AsUnsignedLongLongMask(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(previous) || (old_arg != Py_None && !U64Map_Check(old_arg))) {
        PyErr_SetString(PyExc_TypeError, "swap_many takes a U64Map (or None) as old and a list as previous");
        return NULL;
    }
    U64Map *old = old_arg == Py_None ? NULL : (U64Map *)old_arg;
    if (old != NULL && ready(old) < 0) return NULL;
    PyObject *keys = PySequence_Fast(keys_arg, "swap_many takes a sequence of keys");
    if (keys == NULL) return NULL;
    PyObject *values = PySequence_Fast(values_arg, "swap_many takes a sequence of values");
    if (values == NULL) {
        Py_DECREF(keys);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    if (PySequence_Fast_GET_SIZE(values) < n) n = PySequence_Fast_GET_SIZE(values); /* zip() */
    Py_ssize_t i = start < 0 ? 0 : start, found = 0;
    for (Py_ssize_t j = i; j < i + U64MAP_PREFETCH_AHEAD && j < n; j++)
        prefetch_salted(m, old, PySequence_Fast_GET_ITEM(keys, j), salt);
    for (; i < n; i++) {
        if (i + U64MAP_PREFETCH_AHEAD < n) prefetch_salted(m, old, PySequence_Fast_GET_ITEM(keys, i + U64MAP_PREFETCH_AHEAD), salt);
        PyObject *key_obj = PySequence_Fast_GET_ITEM(keys, i);
        uint64_t key;
        if (!u64_key_fast(key_obj, &key)) {
            if (!PyLong_Check(key_obj)) {
                PyErr_Format(PyExc_TypeError, "swap_many keys are ints, not %.100s", Py_TYPE(key_obj)->tp_name);
                goto fail;
            }
            key = PyLong_AsUnsignedLongLongMask(key_obj);
            if (key == (uint64_t)-1 && PyErr_Occurred()) goto fail;
        }
        key ^= salt;
        PyObject *before = u64map_find(m, key)->value; /* borrowed */
        if (before != NULL) {
            Py_INCREF(before);
        } else if (old != NULL && old->used) {
            U64Slot *s = u64map_find(old, key);
            if (s->value != NULL) before = u64map_take(old, s); /* the reference old held */
        }
        if (before != NULL) found++;
        int failed = PyList_Append(previous, before != NULL ? before : Py_None);
        Py_XDECREF(before);
        if (failed < 0 || u64map_set(m, key, PySequence_Fast_GET_ITEM(values, i)) < 0) goto fail;
        if (m->used >= limit) {
            i++;
            break;
        }
    }
    Py_DECREF(keys);
    Py_DECREF(values);
    return Py_BuildValue("(nn)", i, found);
fail:
    Py_DECREF(keys);
    Py_DECREF(values);
    return NULL;
}

/* drop_some(n) -> int: removes up to n keys (whichever popitem would return first), the number
 * removed. The LRU's incremental release of an evicted generation without a tuple per key. */
static PyObject *m_drop_some(U64Map *m, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t dropped = 0;
    while (dropped < n && m->used > 0) {
        Py_DECREF(u64map_take(m, next_out(m)));
        dropped++;
    }
    return PyLong_FromSsize_t(dropped);
}

static PyObject *m_plan_for(U64Map *m, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "plan_for takes a count of keys >= 0");
        return NULL;
    }
    m->planned = (size_t)n;
    if (planned_within(m, m->mask + 1)) drop_next(m);
    Py_RETURN_NONE;
}

/* Copies slots [from, to) of src into dst, taking a reference to each value. */
static void copy_range(U64Slot *dst, const U64Slot *src, size_t from, size_t to) {
    memcpy(dst + from, src + from, (to - from) * sizeof(U64Slot));
    for (size_t i = from; i < to; i++) Py_XINCREF(dst[i].value);
}

static PyObject *m_copy(U64Map *m, PyObject *unused) {
    (void)unused;
    U64Map *copy = (U64Map *)U64Map_Type.tp_alloc(&U64Map_Type, 0);
    if (copy == NULL) return NULL;
    if (!PyObject_GC_IsTracked((PyObject *)m)) PyObject_GC_UnTrack(copy);
    size_t capacity = m->slots != NULL ? m->mask + 1 : MIN_CAPACITY;
    if (alloc_slots(copy, capacity) < 0) {
        Py_DECREF(copy);
        return NULL;
    }
    if (m->draining != NULL) {
        size_t draining_capacity = m->draining_mask + 1;
        size_t from = m->drain_at; /* below: empty, maybe given back */
        copy->draining = PyMem_Calloc(draining_capacity, sizeof(U64Slot));
        if (copy->draining == NULL) {
            Py_DECREF(copy);
            return PyErr_NoMemory();
        }
        copy_range(copy->draining, m->draining, from, draining_capacity);
        copy->draining_mask = m->draining_mask;
        copy->draining_shift = m->draining_shift;
        copy->drain_at = m->drain_at;
        copy->drain_step = m->drain_step;
    }
    if (m->slots != NULL) {
        copy_range(copy->slots, m->slots, 0, capacity);
        copy->used = m->used;
    }
    copy->planned = m->planned;
    return (PyObject *)copy;
}

static PyObject *m_keys(U64Map *m, PyObject *unused) {
    (void)unused;
    return listing(m, 0);
}

static PyObject *m_values(U64Map *m, PyObject *unused) {
    (void)unused;
    return listing(m, 1);
}

static PyObject *m_items(U64Map *m, PyObject *unused) {
    (void)unused;
    return listing(m, 2);
}

static PyObject *m_clear(U64Map *m, PyObject *unused) {
    (void)unused;
    if (reset(m) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *m_sizeof(U64Map *m, PyObject *unused) {
    (void)unused;
    size_t slots = m->slots != NULL ? (m->mask + 1) * sizeof(U64Slot) : 0;
    if (m->draining != NULL) slots += (m->draining_mask + 1) * sizeof(U64Slot);
    if (m->next != NULL) slots += 2 * (m->mask + 1) * sizeof(U64Slot);
    return PyLong_FromSize_t(sizeof(U64Map) + slots);
}

static PyMethodDef u64map_methods[] = {
    {"get", (PyCFunction)(void (*)(void))m_get, METH_FASTCALL, "get(key, default=None)"},
    {"pop", (PyCFunction)(void (*)(void))m_pop, METH_FASTCALL, "pop(key[, default])"},
    {"popitem", (PyCFunction)m_popitem, METH_NOARGS, "Remove and return some (key, value) pair."},
    {"update", (PyCFunction)m_update, METH_O, "Set the keys of a mapping or of (key, value) pairs."},
    {"fill", (PyCFunction)(void (*)(void))m_fill, METH_FASTCALL, "fill(keys, value): every key set to value."},
    {"get_many", (PyCFunction)m_get_many, METH_O, "The value of each key, or None."},
    {"swap_many", (PyCFunction)(void (*)(void))m_swap_many, METH_FASTCALL,
     "swap_many(keys, values, start, old, limit, salt, previous) -> (stop, found)"},
    {"drop_some", (PyCFunction)m_drop_some, METH_O, "drop_some(n): remove up to n keys; how many."},
    {"plan_for", (PyCFunction)m_plan_for, METH_O,
     "plan_for(n): at most n keys will be held (0: not said); no growth past that is prepared ahead."},
    {"copy", (PyCFunction)m_copy, METH_NOARGS, "A shallow copy."},
    {"keys", (PyCFunction)m_keys, METH_NOARGS, "The keys, as a list."},
    {"values", (PyCFunction)m_values, METH_NOARGS, "The values, as a list."},
    {"items", (PyCFunction)m_items, METH_NOARGS, "The (key, value) pairs, as a list."},
    {"clear", (PyCFunction)m_clear, METH_NOARGS, "Remove every key."},
    {"__sizeof__", (PyCFunction)m_sizeof, METH_NOARGS, "Bytes held, the table included."},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods u64map_as_mapping = {
    (lenfunc)u64map_length,
    (binaryfunc)u64map_subscript,
    (objobjargproc)u64map_ass_subscript,
};

static PySequenceMethods u64map_as_sequence = {
    .sq_contains = (objobjproc)u64map_contains,
};

PyTypeObject U64Map_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ppc_extproc._native.U64Map",
    .tp_doc = "A hash table from ints in [0, 2**64), stored inline, to objects.",
    .tp_basicsize = sizeof(U64Map),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = u64map_new,
    .tp_dealloc = (destructor)u64map_dealloc,
    .tp_traverse = (traverseproc)u64map_traverse,
    .tp_clear = (inquiry)u64map_clear,
    .tp_repr = (reprfunc)u64map_repr,
    .tp_iter = (getiterfunc)u64map_iter,
    .tp_as_mapping = &u64map_as_mapping,
    .tp_as_sequence = &u64map_as_sequence,
    .tp_methods = u64map_methods,
};
