/* The broker's record count for the common shape of a records array, in C.
 *
 * count_plain_records(buffer) -> int walks a records array (protocol/records.py)
 * and returns how many records it holds when every record has the plain shape
 * [int, bin|nil, bin|nil, nil] and nothing follows the array. For anything else
 * (headers, another type, a short or long buffer) it returns -1: "not decided
 * here", and protocol/records.py asks msgspec, the strict reference. So this walk
 * only ever accepts what msgspec accepts, and never refuses anything itself;
 * tests/test_records_fast.py checks that against msgspec on random and damaged
 * arrays. msgspec builds an object per record to count them (about 10 µs for a
 * 16 KiB batch of 100-byte records); this reads lengths only (under 1 µs).
 *
 * v2_records_valid(buffer, record_count) -> bool is the same kind of walk over
 * Kafka's v2 records (protocol/batch_v2.py): True only when the reference,
 * parse_records_v2, accepts them; on False the reference runs and says why.
 * About 10x faster than the reference's walk in Python.
 *
 * Every read is bounds-checked against the buffer's end before it happens.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define UNDECIDED (-1)

static uint32_t
be16(const unsigned char *p)
{
    return ((uint32_t)p[0] << 8) | p[1];
}

static uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* An array header at *pos: its length, or -1 when the byte there is none. */
static int64_t
array_length(const unsigned char *buf, size_t end, size_t *pos)
{
    size_t at = *pos;
    if (at >= end) {
        return -1;
    }
    unsigned char tag = buf[at];
    if ((tag & 0xf0) == 0x90) {
        *pos = at + 1;
        return tag & 0x0f;
    }
    if (tag == 0xdc && end - at >= 3) {
        *pos = at + 3;
        return be16(buf + at + 1);
    }
    if (tag == 0xdd && end - at >= 5) {
        *pos = at + 5;
        return be32(buf + at + 1);
    }
    return -1;
}

/* Step over an int of any msgpack width; 0 when the byte at *pos is no int. */
static int
skip_int(const unsigned char *buf, size_t end, size_t *pos)
{
    size_t at = *pos;
    if (at >= end) {
        return 0;
    }
    unsigned char tag = buf[at];
    size_t width;
    if (tag <= 0x7f || tag >= 0xe0) {
        width = 0;
    } else if (tag == 0xcc || tag == 0xd0) {
        width = 1;
    } else if (tag == 0xcd || tag == 0xd1) {
        width = 2;
    } else if (tag == 0xce || tag == 0xd2) {
        width = 4;
    } else if (tag == 0xcf || tag == 0xd3) {
        width = 8;
    } else {
        return 0;
    }
    if (end - at - 1 < width) {
        return 0;
    }
    *pos = at + 1 + width;
    return 1;
}

/* Step over nil or a bin of any width; 0 when the byte at *pos is neither or the
 * bin runs past the end. */
static int
skip_bin_or_nil(const unsigned char *buf, size_t end, size_t *pos)
{
    size_t at = *pos;
    if (at >= end) {
        return 0;
    }
    unsigned char tag = buf[at];
    size_t head;
    size_t length;
    if (tag == 0xc0) {
        *pos = at + 1;
        return 1;
    }
    if (tag == 0xc4 && end - at >= 2) {
        head = 2;
        length = buf[at + 1];
    } else if (tag == 0xc5 && end - at >= 3) {
        head = 3;
        length = be16(buf + at + 1);
    } else if (tag == 0xc6 && end - at >= 5) {
        head = 5;
        length = be32(buf + at + 1);
    } else {
        return 0;
    }
    if (end - at - head < length) {
        return 0;
    }
    *pos = at + head + length;
    return 1;
}

static Py_ssize_t
count(const unsigned char *buf, size_t end)
{
    size_t pos = 0;
    int64_t records = array_length(buf, end, &pos);
    if (records < 0) {
        return UNDECIDED;
    }
    /* Each plain record takes at least 5 bytes: a count beyond that is a lie. */
    if ((uint64_t)records > (end - pos) / 5) {
        return UNDECIDED;
    }
    for (int64_t i = 0; i < records; i++) {
        if (array_length(buf, end, &pos) != 4 || !skip_int(buf, end, &pos) ||
            !skip_bin_or_nil(buf, end, &pos) || !skip_bin_or_nil(buf, end, &pos) ||
            pos >= end || buf[pos] != 0xc0) {
            return UNDECIDED;
        }
        pos += 1;
    }
    return pos == end ? (Py_ssize_t)records : UNDECIDED;
}

static PyObject *
count_plain_records(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Py_ssize_t n = count((const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(n);
}

/* Kafka's v2 records (protocol/batch_v2.py `parse_records_v2`, the reference):
 * a zigzag varint at *pos of at most max_bytes bytes, none at or past limit.
 * 0 when it is cut or longer. Only varints of up to 5 bytes have their value used,
 * so the value of a longer varlong may lose its high bits. */
static int
zigzag(const unsigned char *buf, size_t limit, size_t *pos, int max_bytes, int64_t *out)
{
    uint64_t value = 0;
    size_t at = *pos;
    for (int i = 0; i < max_bytes; i++) {
        if (at >= limit) {
            return 0;
        }
        unsigned char byte = buf[at++];
        value |= (uint64_t)(byte & 0x7f) << (7 * i < 64 ? 7 * i : 63);
        if (byte < 0x80) {
            *out = (int64_t)(value >> 1) ^ -(int64_t)(value & 1);
            *pos = at;
            return 1;
        }
    }
    return 0;
}

/* A varint-length field at *pos, -1 = null: 0 unless it fits before stop. */
static int
skip_field(const unsigned char *buf, size_t stop, size_t *pos, int utf8)
{
    int64_t length;
    if (!zigzag(buf, stop, pos, 5, &length)) {
        return 0;
    }
    if (length == -1 && !utf8) {
        return 1;
    }
    if (length < 0 || (uint64_t)length > stop - *pos) {
        return 0;
    }
    if (utf8) {
        PyObject *text = PyUnicode_DecodeUTF8((const char *)buf + *pos, (Py_ssize_t)length, "strict");
        if (text == NULL) {
            PyErr_Clear();
            return 0;
        }
        Py_DECREF(text);
    }
    *pos += (size_t)length;
    return 1;
}

static int
v2_records_ok(const unsigned char *buf, size_t end, int64_t record_count)
{
    size_t pos = 0;
    for (int64_t index = 0; index < record_count; index++) {
        int64_t length, delta, offset_delta, header_count;
        if (pos >= end || !zigzag(buf, end, &pos, 5, &length)) {
            return 0;
        }
        if (length < 6 || (uint64_t)length > end - pos) {
            return 0;
        }
        size_t stop = pos + (size_t)length;
        pos += 1; /* attributes */
        if (!zigzag(buf, stop, &pos, 10, &delta) || !zigzag(buf, stop, &pos, 5, &offset_delta) ||
            offset_delta != index || !skip_field(buf, stop, &pos, 0) ||
            !skip_field(buf, stop, &pos, 0) || !zigzag(buf, stop, &pos, 5, &header_count)) {
            return 0;
        }
        if (header_count) {
            if (header_count < 0 || (uint64_t)header_count > (stop - pos) / 2) {
                return 0;
            }
            for (int64_t h = 0; h < header_count; h++) {
                if (!skip_field(buf, stop, &pos, 1) || !skip_field(buf, stop, &pos, 0)) {
                    return 0;
                }
            }
        }
        if (pos != stop) {
            return 0;
        }
    }
    return pos == end;
}

static PyObject *
v2_records_valid(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "v2_records_valid(records, record_count)");
        return NULL;
    }
    long long record_count = PyLong_AsLongLong(args[1]);
    if (record_count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    int ok = v2_records_ok((const unsigned char *)view.buf, (size_t)view.len, record_count);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"count_plain_records", count_plain_records, METH_O,
     "Records in a records array of plain records, or -1 when msgspec must decide."},
    {"v2_records_valid", (PyCFunction)(void (*)(void))v2_records_valid, METH_FASTCALL,
     "Whether bytes are exactly record_count well-formed Kafka v2 records."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "protocol._records_fast",
    "The record count of plain records arrays, in C (see protocol/records.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__records_fast(void)
{
    return PyModule_Create(&module);
}
