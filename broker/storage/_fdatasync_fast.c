/* fdatasync off the event loop without the GIL, in C.
 *
 * submit(eventfd, fds) -> Job hands `fds` to a pool of C threads, which
 * fdatasync each in order, store each call's errno (0 where it succeeded), mark
 * the job done and add 1 to `eventfd`; the event loop waits for that descriptor
 * to be readable and then reads the job's `done` and `errors`. No step of a
 * job's way takes the GIL, so its sync starts while the loop runs Python and its
 * end reaches the loop without a thread waiting to run Python first: the Python
 * threads of broker/storage/sync_threads.py (the reference, used where this does
 * not build) pay a GIL hand-over each way, about 0.1 ms of every commit's round
 * (docs/benchmark-notes.md, "Both sides of a commit, stamped").
 *
 * The caller keeps `eventfd` open for as long as any job it named may be running
 * (sync_threads.py never closes one). A job's memory is freed by the last of its
 * Python object and its thread to let go. At most THREADS_MAX threads run; they
 * are started as jobs find none idle and stay for the process's life, with every
 * signal blocked (they are the main thread's), and an fdatasync interrupted all the
 * same (EINTR) is made again, as os.fdatasync does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS_MAX 4
#define FDS_MAX 65536
#define THREAD_STACK_BYTES (256 * 1024)

typedef struct job {
    struct job *next;
    int eventfd;
    Py_ssize_t count;
    int *fds;
    int *errors;
    atomic_int done;
    atomic_int holders; /* the Python object and, until it has signalled, the thread */
} job_t;

static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_wake = PTHREAD_COND_INITIALIZER;
static job_t *queue_head;
static job_t *queue_tail;
static int jobs_queued;
static int threads_started;
static int threads_idle;

static void
job_release(job_t *job)
{
    if (atomic_fetch_sub_explicit(&job->holders, 1, memory_order_acq_rel) == 1) {
        free(job->fds);
        free(job->errors);
        free(job);
    }
}

static void *
worker(void *unused)
{
    (void)unused;
    for (;;) {
        pthread_mutex_lock(&queue_lock);
        while (queue_head == NULL) {
            threads_idle++;
            pthread_cond_wait(&queue_wake, &queue_lock);
            threads_idle--;
        }
        job_t *job = queue_head;
        queue_head = job->next;
        if (queue_head == NULL) {
            queue_tail = NULL;
        }
        jobs_queued--;
        pthread_mutex_unlock(&queue_lock);

        for (Py_ssize_t i = 0; i < job->count; i++) {
            int failed;
            do { /* as os.fdatasync does: an interrupted call is not a failed one */
                failed = fdatasync(job->fds[i]);
            } while (failed != 0 && errno == EINTR);
            job->errors[i] = failed == 0 ? 0 : errno;
        }
        int eventfd = job->eventfd;
        atomic_store_explicit(&job->done, 1, memory_order_release);
        uint64_t one = 1;
        ssize_t written;
        do {
            written = write(eventfd, &one, sizeof one);
        } while (written < 0 && errno == EINTR);
        job_release(job);
    }
    return NULL;
}

/* A forked child has none of the parent's threads: it starts its own. Jobs queued
 * in the parent are the parent's. */
static void
after_fork_in_child(void)
{
    pthread_mutex_init(&queue_lock, NULL);
    pthread_cond_init(&queue_wake, NULL);
    queue_head = NULL;
    queue_tail = NULL;
    jobs_queued = 0;
    threads_started = 0;
    threads_idle = 0;
}

/* Queue `job`, starting a thread when the idle ones are fewer than the jobs queued
 * (so that a txn.wal sync does not wait behind a round's), up to THREADS_MAX; -1 with
 * errno when none could start and none runs. */
static int
enqueue(job_t *job)
{
    pthread_mutex_lock(&queue_lock);
    if (jobs_queued + 1 > threads_idle && threads_started < THREADS_MAX) {
        pthread_attr_t attr;
        pthread_t thread;
        sigset_t all, before;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, THREAD_STACK_BYTES);
        /* The thread inherits a mask blocking every signal: they are the main thread's. */
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &before);
        int failed = pthread_create(&thread, &attr, worker, NULL);
        pthread_sigmask(SIG_SETMASK, &before, NULL);
        pthread_attr_destroy(&attr);
        if (failed == 0) {
            threads_started++;
        } else if (threads_started == 0) {
            pthread_mutex_unlock(&queue_lock);
            errno = failed;
            return -1;
        }
    }
    job->next = NULL;
    if (queue_tail == NULL) {
        queue_head = job;
    } else {
        queue_tail->next = job;
    }
    queue_tail = job;
    jobs_queued++;
    pthread_cond_signal(&queue_wake);
    pthread_mutex_unlock(&queue_lock);
    return 0;
}

typedef struct {
    PyObject_HEAD
    job_t *job;
} JobObject;

static void
Job_dealloc(JobObject *self)
{
    if (self->job != NULL) {
        job_release(self->job);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Job_done(JobObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(atomic_load_explicit(&self->job->done, memory_order_acquire));
}

static PyObject *
Job_errors(JobObject *self, void *unused)
{
    (void)unused;
    job_t *job = self->job;
    if (!atomic_load_explicit(&job->done, memory_order_acquire)) {
        PyErr_SetString(PyExc_RuntimeError, "the job has not ended");
        return NULL;
    }
    PyObject *errors = PyTuple_New(job->count);
    if (errors == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < job->count; i++) {
        PyObject *value = PyLong_FromLong(job->errors[i]);
        if (value == NULL) {
            Py_DECREF(errors);
            return NULL;
        }
        PyTuple_SET_ITEM(errors, i, value);
    }
    return errors;
}

static PyGetSetDef Job_getset[] = {
    {"done", (getter)Job_done, NULL, "True once every fd of the job was synced.", NULL},
    {"errors", (getter)Job_errors, NULL, "Each fdatasync's errno, 0 where it succeeded.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject JobType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "broker.storage._fdatasync_fast.Job",
    .tp_basicsize = sizeof(JobObject),
    .tp_dealloc = (destructor)Job_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One submit()'s fdatasyncs: `done`, then `errors`.",
    .tp_getset = Job_getset,
};

static PyObject *
submit(PyObject *module, PyObject *args)
{
    (void)module;
    int eventfd;
    PyObject *fds_arg;
    if (!PyArg_ParseTuple(args, "iO:submit", &eventfd, &fds_arg)) {
        return NULL;
    }
    if (eventfd < 0) {
        PyErr_SetString(PyExc_ValueError, "eventfd must be a file descriptor");
        return NULL;
    }
    /* A tuple of our own: converting an item may run Python code, which could change a
     * list under us, never a tuple. */
    PyObject *fds = PySequence_Tuple(fds_arg);
    if (fds == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(fds);
    if (count > FDS_MAX) {
        Py_DECREF(fds);
        PyErr_Format(PyExc_ValueError, "at most %d file descriptors a job", FDS_MAX);
        return NULL;
    }
    JobObject *result = NULL;
    job_t *job = calloc(1, sizeof *job);
    int *fd_values = malloc(sizeof(int) * (size_t)(count ? count : 1));
    int *errors = calloc((size_t)(count ? count : 1), sizeof(int));
    if (job == NULL || fd_values == NULL || errors == NULL) {
        PyErr_NoMemory();
        goto refused;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        long fd = PyLong_AsLong(PyTuple_GET_ITEM(fds, i));
        if (fd == -1 && PyErr_Occurred()) {
            goto refused;
        }
        if (fd < 0 || fd > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "not a file descriptor: %ld", fd);
            goto refused;
        }
        fd_values[i] = (int)fd;
    }
    result = PyObject_New(JobObject, &JobType);
    if (result == NULL) {
        goto refused;
    }
    Py_DECREF(fds);
    job->eventfd = eventfd;
    job->count = count;
    job->fds = fd_values;
    job->errors = errors;
    atomic_init(&job->done, 0);
    atomic_init(&job->holders, 2);
    result->job = job;
    if (enqueue(job) != 0) {
        int failed = errno;
        atomic_store(&job->holders, 1);
        Py_DECREF(result);
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return (PyObject *)result;

refused:
    Py_DECREF(fds);
    free(job);
    free(fd_values);
    free(errors);
    return NULL;
}

static PyMethodDef methods[] = {
    {"submit", submit, METH_VARARGS,
     "submit(eventfd, fds) -> Job: fdatasync each of fds in a C thread, then add 1 to eventfd."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "broker.storage._fdatasync_fast",
    "fdatasync in C threads that signal an eventfd, without the GIL.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__fdatasync_fast(void)
{
    if (PyType_Ready(&JobType) < 0) {
        return NULL;
    }
    if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "FDS_MAX", FDS_MAX) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&JobType);
    if (PyModule_AddObject(m, "Job", (PyObject *)&JobType) < 0) {
        Py_DECREF(&JobType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
