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
 * plain_header(batch, max_bytes, header_type) -> header | None is the broker's whole
 * check of a produced magic-1 batch of plain records but its CRC (protocol/batch.py
 * `validate`; the reference is `validate_reference`): the header decoded once
 * every field is what the reference accepts and the records are counted as above,
 * None wherever the reference must decide or refuse. tests/protocol/test_batch_fast.py holds
 * it to the reference on random and damaged batches.
 *
 * v2_records_valid(buffer, record_count) -> bool is the same kind of walk over
 * Kafka's v2 records (protocol/batch_v2.py): True only when the reference,
 * parse_records_v2, accepts them; on False the reference runs and says why.
 * v2_records_parse(buffer, record_count) -> list | None is that walk building the
 * reference's rows, None where the reference must decide. Both are tens of times
 * faster than the reference in Python. crc32c(buffer, value=0)
 * is the CRC-32C those batches carry.
 *
 * encode_binary_records(values, keys, start, stop) -> bytes writes the records
 * array of rows [start, stop) of Arrow binary columns straight from their buffers
 * (offsets, data, validity), and binary_record_bounds(values, keys, limit,
 * overhead) cuts such columns into runs of at most `limit` bytes: the producer's
 * send_batch path for Arrow arrays (Spark's writer), with no Python object per
 * row. Their pure-Python references are in protocol/records.py, and
 * tests/test_records_fast.py checks both give the same answers.
 *
 * Every read is bounds-checked against the buffer's end before it happens.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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

#define PLAIN_HEADER_BYTES 56
#define PLAIN_HEADER_FIELDS 12

static int64_t
be64(const unsigned char *p)
{
    return (int64_t)(((uint64_t)be32(p) << 32) | be32(p + 4));
}

/* plain_header(batch, max_bytes, header_type) -> BatchHeader | None: the header of
 * a magic-1 batch (protocol/batch.py `validate`, the reference) when the batch is
 * one that `validate` accepts, its CRC aside: batch_length matches the buffer,
 * record_count >= 1 and last_offset_delta = record_count - 1, no compression, an
 * idempotent data batch carries an epoch and a base sequence, the size is within
 * max_bytes (-1: no bound), and the records are exactly record_count plain records
 * (`count` above). The caller compares the CRC. None for anything else, where the
 * reference decides and says why: this never refuses a batch itself. */
static PyObject *
plain_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyType_Check(args[2]) ||
        !PyType_IsSubtype((PyTypeObject *)args[2], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "plain_header(batch, max_bytes, header_type)");
        return NULL;
    }
    long long max_bytes = PyLong_AsLongLong(args[1]);
    if (max_bytes == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)view.buf;
    size_t size = (size_t)view.len;
    int64_t fields[PLAIN_HEADER_FIELDS];
    if (size < PLAIN_HEADER_BYTES || buf[16] != 1) {
        goto undecided;
    }
    fields[0] = be64(buf);                  /* base_offset */
    fields[1] = (int32_t)be32(buf + 8);     /* batch_length */
    fields[2] = be32(buf + 12);             /* crc */
    fields[3] = buf[16];                    /* magic */
    fields[4] = buf[17];                    /* attributes */
    fields[5] = (int32_t)be32(buf + 18);    /* last_offset_delta */
    fields[6] = be64(buf + 22);             /* base_timestamp */
    fields[7] = be64(buf + 30);             /* max_timestamp */
    fields[8] = be64(buf + 38);             /* producer_id */
    fields[9] = (int16_t)be16(buf + 46);    /* producer_epoch */
    fields[10] = (int32_t)be32(buf + 48);   /* base_sequence */
    fields[11] = (int32_t)be32(buf + 52);   /* record_count */
    if (fields[1] + 12 != (int64_t)size || fields[11] < 1 || fields[5] != fields[11] - 1 ||
        (fields[4] & 0x07) != 0 ||
        (fields[8] != -1 && !(fields[4] & 0x20) && (fields[9] < 0 || fields[10] < 0)) ||
        (max_bytes >= 0 && (int64_t)size > max_bytes) ||
        count(buf + PLAIN_HEADER_BYTES, size - PLAIN_HEADER_BYTES) != fields[11]) {
        goto undecided;
    }
    PyBuffer_Release(&view);
    PyTypeObject *header_type = (PyTypeObject *)args[2];
    PyObject *header = header_type->tp_alloc(header_type, PLAIN_HEADER_FIELDS);
    if (header == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PLAIN_HEADER_FIELDS; i++) {
        PyObject *field = PyLong_FromLongLong(fields[i]);
        if (field == NULL) {
            Py_DECREF(header);
            return NULL;
        }
        PyTuple_SET_ITEM(header, i, field);
    }
    return header;
undecided:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* A msgpack int at *pos into *out; 0 when the byte there is no int, it is cut, or
 * it is a uint64 beyond int64 (the reference then decides). */
static int
read_int(const unsigned char *buf, size_t end, size_t *pos, int64_t *out)
{
    size_t at = *pos;
    if (at >= end) {
        return 0;
    }
    unsigned char tag = buf[at];
    if (tag <= 0x7f) {
        *out = tag;
        *pos = at + 1;
        return 1;
    }
    if (tag >= 0xe0) {
        *out = (int8_t)tag;
        *pos = at + 1;
        return 1;
    }
    size_t start = *pos;
    if (!skip_int(buf, end, &start)) {
        return 0;
    }
    const unsigned char *p = buf + at + 1;
    uint64_t wide;
    switch (tag) {
    case 0xcc: *out = p[0]; break;
    case 0xcd: *out = be16(p); break;
    case 0xce: *out = be32(p); break;
    case 0xcf:
        wide = ((uint64_t)be32(p) << 32) | be32(p + 4);
        if (wide > INT64_MAX) {
            return 0;
        }
        *out = (int64_t)wide;
        break;
    case 0xd0: *out = (int8_t)p[0]; break;
    case 0xd1: *out = (int16_t)be16(p); break;
    case 0xd2: *out = (int32_t)be32(p); break;
    default: *out = (int64_t)(((uint64_t)be32(p) << 32) | be32(p + 4)); break;
    }
    *pos = start;
    return 1;
}

/* nil (Py_None, new reference) or a bin (a new bytes) at *pos; NULL when it is
 * neither or cut (no exception then), or when memory ran out (exception set). */
static PyObject *
read_bin_or_nil(const unsigned char *buf, size_t end, size_t *pos)
{
    size_t at = *pos;
    if (!skip_bin_or_nil(buf, end, pos)) {
        return NULL;
    }
    if (buf[at] == 0xc0) {
        Py_RETURN_NONE;
    }
    size_t head = buf[at] == 0xc4 ? 2 : buf[at] == 0xc5 ? 3 : 5;
    return PyBytes_FromStringAndSize((const char *)buf + at + head,
                                     (Py_ssize_t)(*pos - at - head));
}

#define PLAIN_ARGS 9

/* plain_rows(records, record_count, skip, row_type, topic, partition, base_offset,
 * base_timestamp, no_headers) -> list | None: the consumer's decode of a magic-1
 * records array (client/fetcher.py; its reference is protocol/records.py
 * `plain_rows_py`). When the array holds exactly record_count records of the shape
 * [int, bin|nil, bin|nil, nil|[]], the records from index `skip` on, each a
 * row_type 7-tuple (topic, partition, base_offset + i, base_timestamp + delta, key,
 * value, no_headers); None for anything else, where the reference decides. A row
 * holds only atomic objects when no_headers is one, so it is left untracked by the
 * cyclic GC, as the collector itself would leave it after its first look. */
static PyObject *
plain_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != PLAIN_ARGS || !PyType_Check(args[3]) ||
        !PyType_IsSubtype((PyTypeObject *)args[3], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "plain_rows(records, record_count, skip, row_type, topic, partition, "
                        "base_offset, base_timestamp, no_headers)");
        return NULL;
    }
    long long record_count = PyLong_AsLongLong(args[1]);
    long long skip = PyLong_AsLongLong(args[2]);
    long long base_offset = PyLong_AsLongLong(args[6]);
    long long base_timestamp = PyLong_AsLongLong(args[7]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyTypeObject *row_type = (PyTypeObject *)args[3];
    PyObject *topic = args[4], *partition = args[5], *base_ts = args[7], *no_headers = args[8];
    int untrack = !PyObject_GC_IsTracked(topic) && !PyObject_GC_IsTracked(partition) &&
                  !PyObject_GC_IsTracked(no_headers);
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)view.buf;
    size_t end = (size_t)view.len, pos = 0;
    PyObject *rows = NULL;
    int64_t n = array_length(buf, end, &pos);
    /* Each plain record takes at least 5 bytes: a count beyond that is a lie. */
    if (n < 0 || n != record_count || (uint64_t)n > (end - pos) / 5) {
        goto undecided;
    }
    if (skip < 0) {
        skip = 0;
    }
    long long last_offset;
    if (n > 0 && __builtin_add_overflow(base_offset, n - 1, &last_offset)) {
        goto undecided;
    }
    rows = PyList_New(skip < n ? (Py_ssize_t)(n - skip) : 0);
    if (rows == NULL) {
        goto failed;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t delta;
        long long timestamp_ms;
        if (array_length(buf, end, &pos) != 4 || !read_int(buf, end, &pos, &delta) ||
            __builtin_add_overflow(base_timestamp, delta, &timestamp_ms)) {
            goto undecided;
        }
        if (i < skip) {
            if (!skip_bin_or_nil(buf, end, &pos) || !skip_bin_or_nil(buf, end, &pos)) {
                goto undecided;
            }
        }
        else {
            PyObject *key = read_bin_or_nil(buf, end, &pos);
            if (key == NULL) {
                goto key_failed;
            }
            PyObject *value = read_bin_or_nil(buf, end, &pos);
            if (value == NULL) {
                Py_DECREF(key);
                goto key_failed;
            }
            PyObject *offset = PyLong_FromLongLong(base_offset + i);
            PyObject *timestamp =
                delta == 0 ? Py_NewRef(base_ts) : PyLong_FromLongLong(timestamp_ms);
            PyObject *row = row_type->tp_alloc(row_type, 7);
            if (offset == NULL || timestamp == NULL || row == NULL) {
                Py_DECREF(key);
                Py_DECREF(value);
                Py_XDECREF(offset);
                Py_XDECREF(timestamp);
                Py_XDECREF(row);
                goto failed;
            }
            PyTuple_SET_ITEM(row, 0, Py_NewRef(topic));
            PyTuple_SET_ITEM(row, 1, Py_NewRef(partition));
            PyTuple_SET_ITEM(row, 2, offset);
            PyTuple_SET_ITEM(row, 3, timestamp);
            PyTuple_SET_ITEM(row, 4, key);
            PyTuple_SET_ITEM(row, 5, value);
            PyTuple_SET_ITEM(row, 6, Py_NewRef(no_headers));
            if (untrack && PyObject_GC_IsTracked(row)) {
                PyObject_GC_UnTrack(row);
            }
            PyList_SET_ITEM(rows, (Py_ssize_t)(i - skip), row);
        }
        if (pos >= end || (buf[pos] != 0xc0 && buf[pos] != 0x90)) {
            goto undecided;
        }
        pos += 1;
        continue;
    key_failed:
        if (PyErr_Occurred()) {
            goto failed;
        }
        goto undecided;
    }
    if (pos != end) {
        goto undecided;
    }
    PyBuffer_Release(&view);
    return rows;
undecided:
    PyBuffer_Release(&view);
    Py_XDECREF(rows);
    Py_RETURN_NONE;
failed:
    PyBuffer_Release(&view);
    Py_XDECREF(rows);
    return NULL;
}

/* Kafka's v2 records (protocol/batch_v2.py `parse_records_v2`, the reference):
 * a zigzag varint at *pos of at most max_bytes bytes, none at or past limit.
 * 0 when it is cut or longer. The value of a varlong longer than 9 bytes may lose
 * its high bits here: v2_walk leaves such records to the reference. */
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

/* A varint-length field at *pos (-1 = null, when nullable): 0 unless it fits before
 * stop. *start and *length say where its bytes are. */
static int
field(const unsigned char *buf, size_t stop, size_t *pos, int nullable, size_t *start,
      int64_t *length)
{
    if (!zigzag(buf, stop, pos, 5, length)) {
        return 0;
    }
    if (*length == -1 && nullable) {
        return 1;
    }
    if (*length < 0 || (uint64_t)*length > stop - *pos) {
        return 0;
    }
    *start = *pos;
    *pos += (size_t)*length;
    return 1;
}

static PyObject *
bytes_or_none(const unsigned char *buf, size_t start, int64_t length)
{
    if (length < 0) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)buf + start, (Py_ssize_t)length);
}

/* The headers of one record as a list of (str, bytes | None) (None when not keep);
 * NULL when they are malformed, NULL with an exception set when memory ran out. */
static PyObject *
headers(const unsigned char *buf, size_t stop, size_t *pos, int64_t count, int keep)
{
    if (count < 0 || (uint64_t)count > (stop - *pos) / 2) {
        return NULL;
    }
    PyObject *list = keep ? PyList_New(0) : NULL;
    if (keep && list == NULL) {
        return NULL;
    }
    for (int64_t h = 0; h < count; h++) {
        size_t name_at = 0, value_at = 0;
        int64_t name_length, value_length;
        if (!field(buf, stop, pos, 0, &name_at, &name_length)) {
            goto invalid;
        }
        PyObject *name = PyUnicode_DecodeUTF8((const char *)buf + name_at,
                                              (Py_ssize_t)name_length, "strict");
        if (name == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                Py_XDECREF(list);
                return NULL;
            }
            PyErr_Clear();
            goto invalid;
        }
        if (!field(buf, stop, pos, 1, &value_at, &value_length)) {
            Py_DECREF(name);
            goto invalid;
        }
        if (!keep) {
            Py_DECREF(name);
            continue;
        }
        PyObject *value = bytes_or_none(buf, value_at, value_length);
        PyObject *pair = value == NULL ? NULL : PyTuple_Pack(2, name, value);
        Py_DECREF(name);
        Py_XDECREF(value);
        if (pair == NULL || PyList_Append(list, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(pair);
    }
    if (!keep) {
        Py_RETURN_NONE;
    }
    return list;
invalid:
    Py_XDECREF(list);
    return NULL;
}

#define V2_INVALID 0
#define V2_VALID 1
#define V2_ERROR (-1)

/* Walk record_count records; with rows, append each as (timestamp_delta, key, value,
 * headers or None), and answer V2_INVALID for a timestamp varlong of 10 bytes too,
 * whose value may not fit C's ints: the reference then decides. */
static int
v2_walk(const unsigned char *buf, size_t end, int64_t record_count, PyObject *rows)
{
    size_t pos = 0;
    for (int64_t index = 0; index < record_count; index++) {
        int64_t length, delta, offset_delta, key_length, value_length, header_count;
        size_t key_at = 0, value_at = 0;
        if (pos >= end || !zigzag(buf, end, &pos, 5, &length)) {
            return V2_INVALID;
        }
        if (length < 6 || (uint64_t)length > end - pos) {
            return V2_INVALID;
        }
        size_t stop = pos + (size_t)length;
        pos += 1; /* attributes */
        size_t delta_at = pos;
        if (!zigzag(buf, stop, &pos, 10, &delta) || (rows != NULL && pos - delta_at > 9) ||
            !zigzag(buf, stop, &pos, 5, &offset_delta) || offset_delta != index ||
            !field(buf, stop, &pos, 1, &key_at, &key_length) ||
            !field(buf, stop, &pos, 1, &value_at, &value_length) ||
            !zigzag(buf, stop, &pos, 5, &header_count)) {
            return V2_INVALID;
        }
        PyObject *header_list = NULL;
        if (header_count) {
            header_list = headers(buf, stop, &pos, header_count, rows != NULL);
            if (header_list == NULL) {
                return PyErr_Occurred() ? V2_ERROR : V2_INVALID;
            }
            if (rows == NULL) {
                Py_DECREF(header_list);
                header_list = NULL;
            }
        }
        if (pos != stop) {
            Py_XDECREF(header_list);
            return V2_INVALID;
        }
        if (rows == NULL) {
            continue;
        }
        if (header_list == NULL) {
            header_list = Py_NewRef(Py_None);
        }
        PyObject *row = PyTuple_New(4);
        PyObject *items[4] = {PyLong_FromLongLong(delta), bytes_or_none(buf, key_at, key_length),
                              bytes_or_none(buf, value_at, value_length), header_list};
        int failed = row == NULL;
        for (int i = 0; i < 4; i++) {
            if (items[i] == NULL || failed) {
                failed = 1;
                Py_XDECREF(items[i]);
            }
            else {
                PyTuple_SET_ITEM(row, i, items[i]);
            }
        }
        if (failed || PyList_Append(rows, row) < 0) {
            Py_XDECREF(row);
            return V2_ERROR;
        }
        Py_DECREF(row);
    }
    return pos == end ? V2_VALID : V2_INVALID;
}

/* (buffer, record_count) of the Python-facing v2 functions. */
static int
v2_args(PyObject *const *args, Py_ssize_t nargs, const char *usage, Py_buffer *view,
        long long *record_count)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return 0;
    }
    *record_count = PyLong_AsLongLong(args[1]);
    if (*record_count == -1 && PyErr_Occurred()) {
        return 0;
    }
    return PyObject_GetBuffer(args[0], view, PyBUF_SIMPLE) == 0;
}

static PyObject *
v2_records_valid(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Py_buffer view;
    long long record_count;
    if (!v2_args(args, nargs, "v2_records_valid(records, record_count)", &view, &record_count)) {
        return NULL;
    }
    int verdict = v2_walk((const unsigned char *)view.buf, (size_t)view.len, record_count, NULL);
    PyBuffer_Release(&view);
    if (verdict == V2_ERROR) {
        return NULL;
    }
    return PyBool_FromLong(verdict == V2_VALID);
}

static PyObject *
v2_records_parse(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Py_buffer view;
    long long record_count;
    if (!v2_args(args, nargs, "v2_records_parse(records, record_count)", &view, &record_count)) {
        return NULL;
    }
    PyObject *rows = PyList_New(0);
    int verdict = rows == NULL ? V2_ERROR
                               : v2_walk((const unsigned char *)view.buf, (size_t)view.len,
                                         record_count, rows);
    PyBuffer_Release(&view);
    if (verdict == V2_VALID) {
        return rows;
    }
    Py_XDECREF(rows);
    if (verdict == V2_ERROR) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Bytes of Kafka's zigzag varint of v, and the varint at out when out is not NULL. */
static size_t
zigzag_put(unsigned char *out, int64_t v)
{
    uint64_t n = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    size_t i = 0;
    while (n >= 0x80) {
        if (out) {
            out[i] = (unsigned char)((n & 0x7f) | 0x80);
        }
        n >>= 7;
        i++;
    }
    if (out) {
        out[i] = (unsigned char)n;
    }
    return i + 1;
}

/* A bin or nil at *pos: its bytes at *at and length (-1 for nil); 0 when neither. */
static int
bin_span(const unsigned char *buf, size_t end, size_t *pos, size_t *at, int64_t *length)
{
    size_t start = *pos;
    if (!skip_bin_or_nil(buf, end, pos)) {
        return 0;
    }
    if (buf[start] == 0xc0) {
        *length = -1;
        return 1;
    }
    size_t head = buf[start] == 0xc4 ? 2 : buf[start] == 0xc5 ? 3 : 5;
    *at = start + head;
    *length = (int64_t)(*pos - start - head);
    return 1;
}

/* The v2 records of a plain magic-1 records array into out (its size when out is
 * NULL), or -1 when the array is not exactly record_count plain records. */
static Py_ssize_t
write_v2_from_plain(unsigned char *out, const unsigned char *buf, size_t end,
                    int64_t record_count)
{
    size_t pos = 0, written = 0;
    int64_t n = array_length(buf, end, &pos);
    if (n < 0 || n != record_count || (uint64_t)n > (end - pos) / 5) {
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t delta, key_length, value_length;
        size_t key_at = 0, value_at = 0;
        if (array_length(buf, end, &pos) != 4 || !read_int(buf, end, &pos, &delta) ||
            !bin_span(buf, end, &pos, &key_at, &key_length) ||
            !bin_span(buf, end, &pos, &value_at, &value_length) || pos >= end ||
            (buf[pos] != 0xc0 && buf[pos] != 0x90)) {
            return -1;
        }
        pos += 1;
        /* attributes, delta, offset delta, key, value, no headers */
        size_t body = 1 + zigzag_put(NULL, delta) + zigzag_put(NULL, i) +
                      zigzag_put(NULL, key_length) + (key_length > 0 ? (size_t)key_length : 0) +
                      zigzag_put(NULL, value_length) +
                      (value_length > 0 ? (size_t)value_length : 0) + 1;
        if (out == NULL) {
            written += zigzag_put(NULL, (int64_t)body) + body;
            continue;
        }
        written += zigzag_put(out + written, (int64_t)body);
        out[written++] = 0;
        written += zigzag_put(out + written, delta);
        written += zigzag_put(out + written, i);
        written += zigzag_put(out + written, key_length);
        if (key_length > 0) {
            memcpy(out + written, buf + key_at, (size_t)key_length);
            written += (size_t)key_length;
        }
        written += zigzag_put(out + written, value_length);
        if (value_length > 0) {
            memcpy(out + written, buf + value_at, (size_t)value_length);
            written += (size_t)value_length;
        }
        out[written++] = 0;
    }
    return pos == end ? (Py_ssize_t)written : -1;
}

/* v2_records_from_plain(records, record_count) -> bytes | None: a magic-1 records
 * array of exactly record_count plain records ([int, bin|nil, bin|nil, nil|[]]) as
 * Kafka's v2 records field, the kafka listener's conversion of what the SDK wrote
 * (protocol/batch_convert.py `to_v2`); its reference is protocol/batch_v2.py
 * `encode_records_v2` of the decoded rows. None for anything else: the reference
 * converts it. */
static PyObject *
v2_records_from_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Py_buffer view;
    long long record_count;
    if (!v2_args(args, nargs, "v2_records_from_plain(records, record_count)", &view,
                 &record_count)) {
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t size = write_v2_from_plain(NULL, buf, (size_t)view.len, record_count);
    PyObject *out = NULL;
    if (size < 0) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    out = PyBytes_FromStringAndSize(NULL, size);
    if (out != NULL) {
        write_v2_from_plain((unsigned char *)PyBytes_AS_STRING(out), buf, (size_t)view.len,
                            record_count);
    }
    PyBuffer_Release(&view);
    return out;
}

/* CRC-32C (Castagnoli), the checksum of Kafka's v2 batches: with the SSE 4.2
 * instruction where the CPU has it (about 1 us for 16 KiB), else a table. Here and
 * not from the crc32c package because importing that package imports
 * importlib.metadata, hence email and socket, which the protocol package may not. */
static uint32_t crc32c_table[256];

static void
crc32c_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = i;
        for (int k = 0; k < 8; k++) {
            crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1)));
        }
        crc32c_table[i] = crc;
    }
}

static uint32_t
crc32c_bytes(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n--) {
        crc = crc32c_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    }
    return crc;
}

/* Three runs of CRC32C_RUN bytes are summed in parallel by the SSE 4.2 path (the
 * instruction's latency, not its throughput, bounds one run: about 3x), then joined
 * by shifting a run's CRC over the zeros of the next run's length: the operator of
 * CRC32C_RUN zero bytes as four byte tables (Mark Adler's method, crc32c.c). */
#define CRC32C_RUN 256
static uint32_t crc32c_run_zeros[4][256];

static uint32_t
gf2_times(const uint32_t *matrix, uint32_t vector)
{
    uint32_t sum = 0;
    for (; vector; vector >>= 1, matrix++) {
        if (vector & 1) {
            sum ^= *matrix;
        }
    }
    return sum;
}

static void
gf2_square(uint32_t *square, const uint32_t *matrix)
{
    for (int n = 0; n < 32; n++) {
        square[n] = gf2_times(matrix, matrix[n]);
    }
}

/* The tables of the operator that appends `length` zero bytes to a CRC. */
static void
crc32c_zeros_init(uint32_t zeros[4][256], size_t length)
{
    uint32_t odd[32], even[32], *op;
    odd[0] = 0x82f63b78u; /* one zero bit */
    for (int n = 1; n < 32; n++) {
        odd[n] = 1u << (n - 1);
    }
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four */
    /* Each square doubles the zeros: odd holds a byte's worth after the next. */
    for (;;) {
        gf2_square(even, odd);
        op = even;
        length >>= 1;
        if (length == 0) {
            break;
        }
        gf2_square(odd, even);
        op = odd;
        length >>= 1;
        if (length == 0) {
            break;
        }
    }
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = gf2_times(op, n);
        zeros[1][n] = gf2_times(op, n << 8);
        zeros[2][n] = gf2_times(op, n << 16);
        zeros[3][n] = gf2_times(op, n << 24);
    }
}

static uint32_t
crc32c_shift(const uint32_t zeros[4][256], uint32_t crc)
{
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CRC32C_HARDWARE 1
__attribute__((target("sse4.2"))) static uint32_t
crc32c_sse42(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t crc64 = crc;
    while (n >= 3 * CRC32C_RUN) {
        uint64_t crc1 = 0, crc2 = 0;
        for (size_t i = 0; i < CRC32C_RUN; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + CRC32C_RUN + i, 8);
            memcpy(&w2, p + 2 * CRC32C_RUN + i, 8);
            crc64 = __builtin_ia32_crc32di(crc64, w0);
            crc1 = __builtin_ia32_crc32di(crc1, w1);
            crc2 = __builtin_ia32_crc32di(crc2, w2);
        }
        crc64 = crc32c_shift(crc32c_run_zeros, (uint32_t)crc64) ^ (uint32_t)crc1;
        crc64 = crc32c_shift(crc32c_run_zeros, (uint32_t)crc64) ^ (uint32_t)crc2;
        p += 3 * CRC32C_RUN;
        n -= 3 * CRC32C_RUN;
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        crc64 = __builtin_ia32_crc32di(crc64, word);
    }
    crc = (uint32_t)crc64;
    for (; n; n--, p++) {
        crc = __builtin_ia32_crc32qi(crc, *p);
    }
    return crc;
}
#endif

static int crc32c_hardware = 0;

static PyObject *
crc32c(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32c(data, value=0)");
        return NULL;
    }
    unsigned long value = 0;
    if (nargs == 2) {
        value = PyLong_AsUnsignedLong(args[1]);
        if (value == (unsigned long)-1 && PyErr_Occurred()) {
            return NULL;
        }
        if (value > 0xffffffffUL) {
            PyErr_SetString(PyExc_OverflowError, "crc32c value over 32 bits");
            return NULL;
        }
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint32_t crc = ~(uint32_t)value;
    const unsigned char *p = (const unsigned char *)view.buf;
    size_t n = (size_t)view.len;
    Py_BEGIN_ALLOW_THREADS
#ifdef CRC32C_HARDWARE
    crc = crc32c_hardware ? crc32c_sse42(crc, p, n) : crc32c_bytes(crc, p, n);
#else
    crc = crc32c_bytes(crc, p, n);
#endif
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(~crc);
}

/* ------------------------------------------------------------------ binary columns */

/* One Arrow binary array (a chunk of a column): rows [offset, offset + length) of
 * its buffers. Offsets are int32, or int64 when `wide` (large_binary); a row is
 * null when its validity bit is clear (no validity buffer: no nulls). */
typedef struct {
    Py_ssize_t length;
    Py_ssize_t offset;
    int wide;
    int has_validity;
    int has_data;
    Py_buffer validity;
    Py_buffer offsets;
    Py_buffer data;
} chunk_t;

typedef struct {
    Py_ssize_t count;
    Py_ssize_t rows;
    chunk_t *chunks;
} column_t;

static int64_t
chunk_offset(const chunk_t *c, Py_ssize_t row)
{
    Py_ssize_t at = c->offset + row;
    if (c->wide) {
        int64_t v;
        memcpy(&v, (const char *)c->offsets.buf + at * 8, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, (const char *)c->offsets.buf + at * 4, 4);
    return v;
}

static int
chunk_is_null(const chunk_t *c, Py_ssize_t row)
{
    if (!c->has_validity) {
        return 0;
    }
    Py_ssize_t bit = c->offset + row;
    return !((((const unsigned char *)c->validity.buf)[bit >> 3] >> (bit & 7)) & 1);
}

static void
release_column(column_t *col)
{
    for (Py_ssize_t i = 0; i < col->count; i++) {
        chunk_t *c = &col->chunks[i];
        if (c->has_validity) {
            PyBuffer_Release(&c->validity);
        }
        if (c->offsets.obj != NULL) {
            PyBuffer_Release(&c->offsets);
        }
        if (c->has_data) {
            PyBuffer_Release(&c->data);
        }
    }
    PyMem_Free(col->chunks);
    col->chunks = NULL;
    col->count = 0;
}

/* Check one chunk's buffers before any row is read: sizes cover every row, and
 * offsets never decrease nor point past the data. Arrow guarantees this for a
 * valid array; the check keeps a malformed one from reading out of bounds. */
static int
check_chunk(const chunk_t *c)
{
    Py_ssize_t width = c->wide ? 8 : 4;
    if (c->length < 0 || c->offset < 0 || c->offset > PY_SSIZE_T_MAX / 16 - c->length) {
        PyErr_SetString(PyExc_ValueError, "binary chunk: bad length or offset");
        return -1;
    }
    if (c->offsets.len / width < c->offset + c->length + 1) {
        PyErr_SetString(PyExc_ValueError, "binary chunk: offsets buffer too short");
        return -1;
    }
    if (c->has_validity && c->validity.len < (c->offset + c->length + 7) / 8) {
        PyErr_SetString(PyExc_ValueError, "binary chunk: validity buffer too short");
        return -1;
    }
    Py_ssize_t data_len = c->has_data ? c->data.len : 0;
    int64_t previous = chunk_offset(c, 0);
    if (previous < 0) {
        PyErr_SetString(PyExc_ValueError, "binary chunk: negative offset");
        return -1;
    }
    for (Py_ssize_t row = 1; row <= c->length; row++) {
        int64_t next = chunk_offset(c, row);
        if (next < previous) {
            PyErr_SetString(PyExc_ValueError, "binary chunk: offsets decrease");
            return -1;
        }
        previous = next;
    }
    if (previous > data_len) {
        PyErr_SetString(PyExc_ValueError, "binary chunk: offsets past the data buffer");
        return -1;
    }
    return 0;
}

/* A column from a sequence of (length, offset, validity|None, offsets, data|None,
 * wide) tuples (protocol.records.BinaryChunk). Only the chunks holding rows of
 * [start, stop) are checked (check_chunk): the others are never read, and a send
 * of a few MiB is encoded as several runs that each touch a few of its chunks. */
static int
parse_column(PyObject *sequence, column_t *col, Py_ssize_t start, Py_ssize_t stop)
{
    col->count = 0;
    col->rows = 0;
    col->chunks = NULL;
    PyObject *fast = PySequence_Fast(sequence, "a column is a sequence of BinaryChunk");
    if (fast == NULL) {
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    col->chunks = PyMem_Calloc(n ? (size_t)n : 1, sizeof(chunk_t));
    if (col->chunks == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *validity, *offsets, *data;
        chunk_t *c = &col->chunks[i];
        col->count = i + 1;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "nnOOOp;a BinaryChunk",
                              &c->length, &c->offset, &validity, &offsets, &data, &c->wide)) {
            goto fail;
        }
        if (validity != Py_None) {
            if (PyObject_GetBuffer(validity, &c->validity, PyBUF_SIMPLE) < 0) {
                goto fail;
            }
            c->has_validity = 1;
        }
        if (PyObject_GetBuffer(offsets, &c->offsets, PyBUF_SIMPLE) < 0) {
            goto fail;
        }
        if (data != Py_None) {
            if (PyObject_GetBuffer(data, &c->data, PyBUF_SIMPLE) < 0) {
                goto fail;
            }
            c->has_data = 1;
        }
        if (c->length < 0) {
            PyErr_SetString(PyExc_ValueError, "binary chunk: bad length or offset");
            goto fail;
        }
        if (col->rows < stop && col->rows + c->length > start && check_chunk(c) < 0) {
            goto fail;
        }
        col->rows += c->length;
    }
    Py_DECREF(fast);
    return 0;
fail:
    Py_DECREF(fast);
    release_column(col);
    return -1;
}

/* Walks a column's rows in order across its chunks. */
typedef struct {
    const column_t *col;
    Py_ssize_t chunk;
    Py_ssize_t row;
} cursor_t;

static void
cursor_seek(cursor_t *cur, const column_t *col, Py_ssize_t row)
{
    cur->col = col;
    cur->chunk = 0;
    while (cur->chunk < col->count && row >= col->chunks[cur->chunk].length) {
        row -= col->chunks[cur->chunk].length;
        cur->chunk++;
    }
    cur->row = row;
}

/* The current row's bytes and length, NULL for a null row; then step on. A chunk
 * without a data buffer holds only empty or null rows. */
static const unsigned char *
cursor_next(cursor_t *cur, Py_ssize_t *length)
{
    static const unsigned char empty[1] = {0};
    while (cur->row >= cur->col->chunks[cur->chunk].length) {
        cur->chunk++;
        cur->row = 0;
    }
    const chunk_t *c = &cur->col->chunks[cur->chunk];
    Py_ssize_t row = cur->row++;
    *length = 0;
    if (chunk_is_null(c, row)) {
        return NULL;
    }
    int64_t begin = chunk_offset(c, row);
    *length = (Py_ssize_t)(chunk_offset(c, row + 1) - begin);
    return c->has_data ? (const unsigned char *)c->data.buf + begin : empty;
}

/* msgpack's bin header for `length` (or nil for a null row): its size, and its
 * bytes at `out` when out is not NULL. */
static Py_ssize_t
bin_header(unsigned char *out, const unsigned char *item, Py_ssize_t length)
{
    if (item == NULL) {
        if (out) {
            out[0] = 0xc0;
        }
        return 1;
    }
    if (length < 0x100) {
        if (out) {
            out[0] = 0xc4;
            out[1] = (unsigned char)length;
        }
        return 2;
    }
    if (length < 0x10000) {
        if (out) {
            out[0] = 0xc5;
            out[1] = (unsigned char)(length >> 8);
            out[2] = (unsigned char)length;
        }
        return 3;
    }
    if (out) {
        out[0] = 0xc6;
        out[1] = (unsigned char)(length >> 24);
        out[2] = (unsigned char)(length >> 16);
        out[3] = (unsigned char)(length >> 8);
        out[4] = (unsigned char)length;
    }
    return 5;
}

static Py_ssize_t
array_header(unsigned char *out, Py_ssize_t n)
{
    if (n < 16) {
        if (out) {
            out[0] = (unsigned char)(0x90 | n);
        }
        return 1;
    }
    if (n < 0x10000) {
        if (out) {
            out[0] = 0xdc;
            out[1] = (unsigned char)(n >> 8);
            out[2] = (unsigned char)n;
        }
        return 3;
    }
    if (out) {
        out[0] = 0xdd;
        out[1] = (unsigned char)(n >> 24);
        out[2] = (unsigned char)(n >> 16);
        out[3] = (unsigned char)(n >> 8);
        out[4] = (unsigned char)n;
    }
    return 5;
}

/* The records of rows [start, stop) into `out`, or only their size when out is
 * NULL: [0, key bin|nil, value bin|nil, nil] each, after the array header. */
static Py_ssize_t
write_records(unsigned char *out, const column_t *values, const column_t *keys,
              Py_ssize_t start, Py_ssize_t stop)
{
    cursor_t vcur, kcur;
    cursor_seek(&vcur, values, start);
    if (keys) {
        cursor_seek(&kcur, keys, start);
    }
    Py_ssize_t pos = array_header(out, stop - start);
    for (Py_ssize_t i = start; i < stop; i++) {
        Py_ssize_t klen = 0, vlen;
        const unsigned char *key = NULL;
        if (keys) {
            key = cursor_next(&kcur, &klen);
        }
        const unsigned char *value = cursor_next(&vcur, &vlen);
        if (klen > 0xffffffffLL || vlen > 0xffffffffLL) {
            return -1; /* over msgpack's bin32: no batch could hold it anyway */
        }
        if (out) {
            out[pos] = 0x94;
            out[pos + 1] = 0x00;
        }
        pos += 2;
        pos += bin_header(out ? out + pos : NULL, key, klen);
        if (key != NULL) {
            if (out) {
                memcpy(out + pos, key, (size_t)klen);
            }
            pos += klen;
        }
        pos += bin_header(out ? out + pos : NULL, value, vlen);
        if (value != NULL) {
            if (out) {
                memcpy(out + pos, value, (size_t)vlen);
            }
            pos += vlen;
        }
        if (out) {
            out[pos] = 0xc0;
        }
        pos += 1;
    }
    return pos;
}

static int
parse_columns(PyObject *values_arg, PyObject *keys_arg, column_t *values, column_t *keys,
              Py_ssize_t start, Py_ssize_t stop)
{
    if (parse_column(values_arg, values, start, stop) < 0) {
        return -1;
    }
    if (keys_arg != Py_None) {
        if (parse_column(keys_arg, keys, start, stop) < 0) {
            release_column(values);
            return -1;
        }
        if (keys->rows != values->rows) {
            PyErr_Format(PyExc_ValueError, "%zd keys for %zd values", keys->rows, values->rows);
            release_column(keys);
            release_column(values);
            return -1;
        }
    }
    return 0;
}

static PyObject *
encode_binary_records(PyObject *module, PyObject *args)
{
    PyObject *values_arg, *keys_arg;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "OOnn:encode_binary_records", &values_arg, &keys_arg, &start,
                          &stop)) {
        return NULL;
    }
    column_t values, keys = {0, 0, NULL};
    if (parse_columns(values_arg, keys_arg, &values, &keys, start, stop) < 0) {
        return NULL;
    }
    const column_t *keyed = keys_arg != Py_None ? &keys : NULL;
    PyObject *result = NULL;
    if (start < 0 || stop < start || stop > values.rows) {
        PyErr_Format(PyExc_ValueError, "rows [%zd, %zd) of %zd", start, stop, values.rows);
        goto done;
    }
    Py_ssize_t size;
    Py_BEGIN_ALLOW_THREADS
    size = write_records(NULL, &values, keyed, start, stop);
    Py_END_ALLOW_THREADS
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "a key or value of 4 GiB or more");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL) {
        goto done;
    }
    /* The bytes object is not shared yet and Arrow buffers are immutable: the
     * copy needs no GIL, and the caller's other threads go on meanwhile. */
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    write_records(out, &values, keyed, start, stop);
    Py_END_ALLOW_THREADS
done:
    release_column(&values);
    if (keyed) {
        release_column(&keys);
    }
    return result;
}

static PyObject *
binary_record_bounds(PyObject *module, PyObject *args)
{
    PyObject *values_arg, *keys_arg;
    Py_ssize_t limit, overhead;
    if (!PyArg_ParseTuple(args, "OOnn:binary_record_bounds", &values_arg, &keys_arg, &limit,
                          &overhead)) {
        return NULL;
    }
    column_t values, keys = {0, 0, NULL};
    if (parse_columns(values_arg, keys_arg, &values, &keys, 0, PY_SSIZE_T_MAX) < 0) {
        return NULL;
    }
    const column_t *keyed = keys_arg != Py_None ? &keys : NULL;
    PyObject *bounds = PyList_New(0);
    if (bounds == NULL) {
        goto done;
    }
    cursor_t vcur, kcur;
    cursor_seek(&vcur, &values, 0);
    if (keyed) {
        cursor_seek(&kcur, keyed, 0);
    }
    /* Greedy, as client.columns.Columns.bounds: each run takes records while their
     * sizes add up to at most `limit`; a record alone over it ends the list with
     * an empty run at its row. */
    Py_ssize_t begin = 0, used = 0;
    for (Py_ssize_t i = 0; i <= values.rows; i++) {
        Py_ssize_t size = 0;
        if (i < values.rows) {
            Py_ssize_t klen = 0, vlen;
            if (keyed) {
                cursor_next(&kcur, &klen);
            }
            cursor_next(&vcur, &vlen);
            size = overhead + klen + vlen;
            if (i > begin && used <= limit - size) {
                used += size;
                continue;
            }
        }
        if (i > begin) {
            PyObject *run = Py_BuildValue("(nn)", begin, i);
            if (run == NULL || PyList_Append(bounds, run) < 0) {
                Py_XDECREF(run);
                Py_CLEAR(bounds);
                goto done;
            }
            Py_DECREF(run);
        }
        if (i == values.rows) {
            break;
        }
        if (size > limit) {
            PyObject *run = Py_BuildValue("(nn)", i, i);
            if (run == NULL || PyList_Append(bounds, run) < 0) {
                Py_CLEAR(bounds);
            }
            Py_XDECREF(run);
            goto done;
        }
        begin = i;
        used = size;
    }
done:
    release_column(&values);
    if (keyed) {
        release_column(&keys);
    }
    return bounds;
}

/* One item of a list column: its bytes (NULL for None) and length; 0 when it is
 * neither bytes nor None, or longer than msgpack's bin32. */
static int
list_item(PyObject *item, const unsigned char **data, Py_ssize_t *length)
{
    if (item == Py_None) {
        *data = NULL;
        *length = 0;
        return 1;
    }
    if (!PyBytes_CheckExact(item) || PyBytes_GET_SIZE(item) > 0xffffffffLL) {
        return 0;
    }
    *data = (const unsigned char *)PyBytes_AS_STRING(item);
    *length = PyBytes_GET_SIZE(item);
    return 1;
}

/* The records of rows [start, stop) of list columns into `out`, or only their size
 * when out is NULL; -1 when an item is not bytes or None. */
static Py_ssize_t
write_list_records(unsigned char *out, PyObject *values, PyObject *keys, Py_ssize_t start,
                   Py_ssize_t stop)
{
    Py_ssize_t pos = array_header(out, stop - start);
    for (Py_ssize_t i = start; i < stop; i++) {
        const unsigned char *key = NULL, *value;
        Py_ssize_t klen = 0, vlen;
        if ((keys != Py_None && !list_item(PyList_GET_ITEM(keys, i), &key, &klen)) ||
            !list_item(PyList_GET_ITEM(values, i), &value, &vlen)) {
            return -1;
        }
        if (out) {
            out[pos] = 0x94;
            out[pos + 1] = 0x00;
        }
        pos += 2;
        pos += bin_header(out ? out + pos : NULL, key, klen);
        if (key != NULL) {
            if (out) {
                memcpy(out + pos, key, (size_t)klen);
            }
            pos += klen;
        }
        pos += bin_header(out ? out + pos : NULL, value, vlen);
        if (value != NULL) {
            if (out) {
                memcpy(out + pos, value, (size_t)vlen);
            }
            pos += vlen;
        }
        if (out) {
            out[pos] = 0xc0;
        }
        pos += 1;
    }
    return pos;
}

/* bytes_lengths(column: list) -> list[int] | None: len() of every item when every
 * item is exactly bytes, else None (protocol/records.py `_lengths` then looks at the
 * column itself, as it did before this): send_batch's sizes of a column in one pass
 * without a call per item. */
static PyObject *
bytes_lengths(PyObject *module, PyObject *column)
{
    (void)module;
    if (!PyList_CheckExact(column)) {
        PyErr_SetString(PyExc_TypeError, "bytes_lengths(column: list)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(column);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_CheckExact(PyList_GET_ITEM(column, i))) {
            Py_RETURN_NONE;
        }
    }
    PyObject *lengths = PyList_New(n);
    if (lengths == NULL) {
        return NULL;
    }
    /* No Python code runs between the check and here: the list cannot change. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *length = PyLong_FromSsize_t(PyBytes_GET_SIZE(PyList_GET_ITEM(column, i)));
        if (length == NULL) {
            Py_DECREF(lengths);
            return NULL;
        }
        PyList_SET_ITEM(lengths, i, length);
    }
    return lengths;
}

/* encode_list_records(values, keys, start, stop) -> bytes | None: the records array
 * of rows [start, stop) of a list of values (bytes or None) and a list of keys or
 * None, every timestamp_delta 0 and no headers: protocol/records.py RecordColumns'
 * encoding (its reference), in one pass to size and one to copy, with no object per
 * row. None when an item is neither bytes nor None: the reference decides. */
static PyObject *
encode_list_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyList_CheckExact(args[0]) ||
        (args[1] != Py_None && !PyList_CheckExact(args[1]))) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_list_records(values: list, keys: list | None, start, stop)");
        return NULL;
    }
    PyObject *values = args[0], *keys = args[1];
    Py_ssize_t start = PyLong_AsSsize_t(args[2]), stop = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (!(0 <= start && start <= stop && stop <= n) ||
        (keys != Py_None && PyList_GET_SIZE(keys) != n)) {
        PyErr_Format(PyExc_ValueError, "rows [%zd, %zd) of %zd values", start, stop, n);
        return NULL;
    }
    /* Only bytes objects are read and nothing here runs Python code between the two
     * passes, so the lists cannot change under them. */
    Py_ssize_t size = write_list_records(NULL, values, keys, start, stop);
    if (size < 0) {
        Py_RETURN_NONE;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) {
        return NULL;
    }
    write_list_records((unsigned char *)PyBytes_AS_STRING(out), values, keys, start, stop);
    return out;
}

static PyMethodDef methods[] = {
    {"count_plain_records", count_plain_records, METH_O,
     "Records in a records array of plain records, or -1 when msgspec must decide."},
    {"plain_header", (PyCFunction)(void (*)(void))plain_header, METH_FASTCALL,
     "The header of a magic-1 batch validate accepts (its CRC aside), or None."},
    {"plain_rows", (PyCFunction)(void (*)(void))plain_rows, METH_FASTCALL,
     "The consumer's rows of a records array of plain records, or None for the reference."},
    {"v2_records_from_plain", (PyCFunction)(void (*)(void))v2_records_from_plain, METH_FASTCALL,
     "A plain magic-1 records array as Kafka's v2 records, or None for the reference."},
    {"crc32c", (PyCFunction)(void (*)(void))crc32c, METH_FASTCALL,
     "CRC-32C of a buffer, continuing from value (as the crc32c package's crc32c)."},
    {"v2_records_valid", (PyCFunction)(void (*)(void))v2_records_valid, METH_FASTCALL,
     "Whether bytes are exactly record_count well-formed Kafka v2 records."},
    {"v2_records_parse", (PyCFunction)(void (*)(void))v2_records_parse, METH_FASTCALL,
     "The rows of exactly record_count well-formed Kafka v2 records, or None."},
    {"bytes_lengths", bytes_lengths, METH_O,
     "len() of every item of a list of bytes, or None when an item is not bytes."},
    {"encode_list_records", (PyCFunction)(void (*)(void))encode_list_records, METH_FASTCALL,
     "The records array of rows [start, stop) of list columns of bytes or None, or None."},
    {"encode_binary_records", encode_binary_records, METH_VARARGS,
     "The records array of rows [start, stop) of Arrow binary columns, from their buffers."},
    {"binary_record_bounds", binary_record_bounds, METH_VARARGS,
     "[start, stop) runs of Arrow binary columns whose records fit `limit` bytes each."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "protocol._records_fast",
    "Records arrays in C: plain counts, Arrow binary columns, Kafka's v2 records and "
    "CRC-32C (see protocol/records.py, protocol/batch_v2.py).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__records_fast(void)
{
    crc32c_init();
    crc32c_zeros_init(crc32c_run_zeros, CRC32C_RUN);
#ifdef CRC32C_HARDWARE
    __builtin_cpu_init();
    crc32c_hardware = __builtin_cpu_supports("sse4.2");
#endif
    return PyModule_Create(&module);
}
