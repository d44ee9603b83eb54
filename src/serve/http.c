/* http.c: libmicrohttpd under the route table of http.h: a pool of epoll threads reads and
 * writes every connection; a request, once read, is handled on a thread of its own. */
#include "serve/http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define DRAIN_S 2.0 /* at http_stop, how long the requests under way get to send their end */
#define POOL_THREADS 4       /* libmicrohttpd's polling threads: they only move bytes */
#define HEAD_TIMEOUT_S 10u   /* reading a request's head and body; the answer's own is --timeout */
#define HEADER_MAX (64 << 10) /* bytes of a request's header lines: over it, 431 */
#define CONN_MEMORY (256 << 10) /* a connection's buffer (headers up to it reach us, to be refused as JSON) */
#define STREAM_HOLD (256 << 10) /* a stream's bytes produced ahead of its reader, at most */
/* Each connection's kernel send buffer (the kernel doubles it): a fixed size instead of
 * autotuning up to tcp_wmem's 4 MiB, so a client that stops reading holds little kernel
 * memory and its stream stalls soon, to be cut after the timeout. Ample for an SSE stream. */
#define SNDBUF_BYTES (128 << 10)

/* A request whose body is in runs on a thread of its own (a job), never on a polling
 * thread: handlers block (a whole answer waits for its generation, a stream's producer for
 * tokens). Its connection is suspended meanwhile (no timeout runs, no thread is held by an
 * idle socket) and resumed when the answer is ready; a stream's bytes go through the job's
 * buffer, the connection suspended while it is empty. */
typedef struct job job;

struct http_server {
    struct MHD_Daemon *d;
    const http_route *routes;
    void *app;
    http_opts o;
    int port;
    atomic_int busy;        /* requests under way: from their headers to on_completed */
    pthread_mutex_t mu;     /* jobs, stopping */
    pthread_cond_t cv;      /* a job ended */
    int n_jobs;             /* jobs whose thread runs */
    bool stopping;
};

struct job {
    http_server *s;
    struct MHD_Connection *conn;
    const http_route *hit;
    http_call c;
    http_out out;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;               /* the connection's side and the thread's */
    bool answered;          /* out is set: the handler returned */
    bool suspended;         /* the connection is, and only the job resumes it */
    bool conn_gone;         /* the request ended on MHD's side: conn is not to be touched */
    bool stream_end;        /* the producer returned -1 */
    char *held;             /* a stream's bytes not yet sent: held[off, len) */
    size_t held_off, held_len, held_cap;
};

/* one request's state across the access handler's calls */
typedef struct req_ctx {
    char *body;
    size_t len, cap;
    bool too_big;
    job *j;                 /* once the body is in */
} req_ctx;

/* -------------------------------------------------------------- answers */

void http_json(http_out *o, int status, cJSON *j) {
    o->status = status;
    o->content_type = "application/json";
    o->body = cJSON_PrintUnformatted(j);
    o->len = o->body ? strlen(o->body) : 0;
    cJSON_Delete(j);
}

void http_error(http_out *o, const http_call *c, int status, const char *type, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *j = cJSON_CreateObject(), *err = cJSON_CreateObject();
    if (c && c->anthropic) { /* {"type": "error", "error": {"type", "message"}} */
        cJSON_AddStringToObject(j, "type", "error");
        cJSON_AddStringToObject(err, "type", type);
        cJSON_AddStringToObject(err, "message", msg);
    } else { /* OpenAI's {"error": {"code", "message", "type"}}, as llama-server answers */
        cJSON_AddNumberToObject(err, "code", status);
        cJSON_AddStringToObject(err, "message", msg);
        cJSON_AddStringToObject(err, "type", type);
    }
    cJSON_AddItemToObject(j, "error", err);
    http_json(o, status, j);
}

bool http_client_gone(const http_call *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
    char b;
    return recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0; /* an orderly close */
}

const char *http_header(const http_call *c, const char *name) {
    return MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, name);
}

const char *http_query(const http_call *c, const char *name) {
    return MHD_lookup_connection_value(c->conn, MHD_GET_ARGUMENT_KIND, name);
}

/* -------------------------------------------------------------- jobs */

static void job_unref(job *j) {
    pthread_mutex_lock(&j->mu);
    const int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    free(j->held);
    free((char *)j->c.body);
    free((char *)j->c.url);
    free((char *)j->c.method);
    if (j->out.body) free(j->out.body);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* under j->mu: the connection back into its polling thread's loop, where it is suspended */
static void job_resume(job *j) {
    if (j->suspended && !j->conn_gone) {
        j->suspended = false;
        MHD_resume_connection(j->conn);
    }
}

/* A stream's bytes, from its producer into the job's buffer (at most STREAM_HOLD ahead of
 * the reader: a client that stops reading stops its producer, and its connection is cut
 * after --timeout), each new piece resuming the connection. */
static void job_stream(job *j) {
    char chunk[16384];
    for (;;) {
        pthread_mutex_lock(&j->mu);
        while (!j->conn_gone && !j->s->stopping && j->held_len - j->held_off >= STREAM_HOLD) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 100 * 1000 * 1000; /* http_stop's flag is read at least this often */
            if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&j->cv, &j->mu, &until);
        }
        const bool gone = j->conn_gone || j->s->stopping;
        pthread_mutex_unlock(&j->mu);
        ssize_t n = gone ? -1 : j->out.produce(j->out.cls, chunk, sizeof chunk);
        pthread_mutex_lock(&j->mu);
        if (n > 0) {
            if (j->held_off == j->held_len) j->held_off = j->held_len = 0;
            if (j->held_len + (size_t)n > j->held_cap) {
                j->held_cap = (j->held_len + (size_t)n) * 2;
                j->held = xrealloc(j->held, j->held_cap);
            }
            memcpy(j->held + j->held_len, chunk, (size_t)n);
            j->held_len += (size_t)n;
        }
        if (n < 0) j->stream_end = true;
        if (n != 0) job_resume(j);
        pthread_mutex_unlock(&j->mu);
        if (n < 0) break;
    }
    if (j->out.done) j->out.done(j->out.cls); /* the producer's state, on the thread that used it */
}

static void *job_main(void *arg) {
    job *j = arg;
    j->hit->fn(j->s->app, &j->c, &j->out);
    pthread_mutex_lock(&j->mu);
    j->answered = true;
    job_resume(j);
    pthread_mutex_unlock(&j->mu);
    if (j->out.produce) job_stream(j);
    http_server *s = j->s;
    job_unref(j);
    pthread_mutex_lock(&s->mu);
    s->n_jobs--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* MHD's reader of a stream: the job's bytes, or (none yet) the connection suspended until
 * the job has more */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    ssize_t n = 0;
    if (j->held_off < j->held_len) {
        n = (ssize_t)(j->held_len - j->held_off < max ? j->held_len - j->held_off : max);
        memcpy(buf, j->held + j->held_off, (size_t)n);
        j->held_off += (size_t)n;
        pthread_cond_signal(&j->cv); /* room again */
    } else if (j->stream_end) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (j->s->stopping) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
        j->suspended = true;
        MHD_suspend_connection(j->conn);
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

static void stream_free(void *cls) { job_unref(cls); }

/* -------------------------------------------------------------- the access handler */

/* constant time in the length of the expected key */
static bool key_equal(const char *given, const char *want) {
    const size_t nw = strlen(want), ng = given ? strlen(given) : 0;
    unsigned char d = (unsigned char)(ng != nw);
    for (size_t i = 0; i < nw; i++) d |= (unsigned char)(want[i] ^ (i < ng ? given[i] : 0));
    return d == 0;
}

static bool authorized(const http_server *s, const http_call *c) {
    if (!s->o.api_key) return true;
    const char *auth = http_header(c, "Authorization"), *x = http_header(c, "x-api-key");
    if (auth && !strncasecmp(auth, "Bearer ", 7)) return key_equal(auth + 7, s->o.api_key);
    return key_equal(x, s->o.api_key);
}

/* o as the connection's answer; a stream reads from j (which it holds a reference to) */
static enum MHD_Result send_out(struct MHD_Connection *conn, http_out *o, job *j) {
    struct MHD_Response *r;
    if (o->produce) {
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, j, stream_free);
    } else {
        r = o->body ? MHD_create_response_from_buffer(o->len, o->body, MHD_RESPMEM_MUST_FREE)
                    : MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
        o->body = NULL; /* the response's now */
    }
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", o->content_type ? o->content_type : "application/json");
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    if (o->produce) MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)o->status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    http_server *s = cls;
    req_ctx *rc = *con_cls;
    if (!rc) { /* headers are in: the body (if any) follows in later calls */
        rc = xcalloc(1, sizeof *rc);
        *con_cls = rc;
        atomic_fetch_add(&s->busy, 1);
        size_t head = 0;
        MHD_get_connection_values(conn, MHD_HEADER_KIND, count_header, &head);
        if (head <= HEADER_MAX) return MHD_YES;
        http_out o = {0};
        http_call c = {.conn = conn, .method = method, .url = url, .body = "", .anthropic = !strncmp(url, "/v1/messages", 12)};
        http_error(&o, &c, 431, "invalid_request_error", "the request's header lines are over %d bytes", HEADER_MAX);
        return send_out(conn, &o, NULL);
    }
    if (rc->j) { /* resumed: the job's answer is ready */
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, s->o.timeout_s);
        return send_out(conn, &rc->j->out, rc->j);
    }
    if (*upload_size) {
        if (!rc->too_big && rc->len + *upload_size > s->o.body_max) rc->too_big = true;
        if (!rc->too_big) {
            if (rc->len + *upload_size + 1 > rc->cap) {
                rc->cap = (rc->len + *upload_size + 1) * 2;
                if (rc->cap > s->o.body_max + 1) rc->cap = s->o.body_max + 1;
                rc->body = xrealloc(rc->body, rc->cap);
            }
            memcpy(rc->body + rc->len, upload, *upload_size);
            rc->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    http_call c = {.conn = conn, .method = method, .url = url, .body = rc->body ? rc->body : "", .body_len = rc->len};
    if (rc->body) rc->body[rc->len] = 0;
    c.anthropic = !strncmp(url, "/v1/messages", 12);
    http_out o = {0};
    const http_route *hit = NULL;
    bool path_known = false;
    for (const http_route *r = s->routes; r->path; r++) {
        const size_t n = strlen(r->path);
        const bool match = n > 1 && r->path[n - 1] == '/' ? !strncmp(url, r->path, n) : !strcmp(url, r->path);
        if (!match) continue;
        path_known = true;
        if (!strcmp(method, r->method)) { hit = r; break; }
    }
    if (!strcmp(method, "OPTIONS")) { /* CORS preflight */
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "*");
        enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_NO_CONTENT, r);
        MHD_destroy_response(r);
        return ret;
    }
    pthread_mutex_lock(&s->mu);
    const bool stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    if (!hit && path_known) http_error(&o, &c, 405, "invalid_request_error", "%s does not take %s", url, method);
    else if (!hit) http_error(&o, &c, 404, "not_found_error", "no such endpoint: %s %s", method, url);
    else if (!hit->open && !authorized(s, &c)) http_error(&o, &c, 401, "authentication_error", "invalid API key");
    else if (rc->too_big)
        http_error(&o, &c, 413, "invalid_request_error", "the request body is over %zu bytes", s->o.body_max);
    else if (stopping) http_error(&o, &c, 503, "unavailable_error", "the server is stopping");
    if (o.status) return send_out(conn, &o, NULL);
    /* the handler on a thread of its own, the connection suspended until it answers */
    job *j = xcalloc(1, sizeof *j);
    *j = (job){.s = s, .conn = conn, .hit = hit, .refs = 2};
    j->c = (http_call){.conn = conn, .method = xstrdup(method), .url = xstrdup(url),
                       .body = rc->body ? rc->body : xstrdup(""), .body_len = rc->len, .anthropic = c.anthropic};
    rc->body = NULL; /* the job's */
    rc->j = j;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    pthread_mutex_lock(&s->mu);
    s->n_jobs++;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&j->mu);
    if (pthread_create(&th, &at, job_main, j) != 0) {
        pthread_mutex_unlock(&j->mu);
        pthread_attr_destroy(&at);
        pthread_mutex_lock(&s->mu);
        s->n_jobs--;
        pthread_mutex_unlock(&s->mu);
        rc->j = NULL;
        job_unref(j);
        job_unref(j);
        http_error(&o, &c, 503, "unavailable_error", "no thread for the request");
        return send_out(conn, &o, NULL);
    }
    pthread_attr_destroy(&at);
    j->suspended = true;
    MHD_suspend_connection(conn);
    pthread_mutex_unlock(&j->mu);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    http_server *s = cls;
    req_ctx *rc = *con_cls;
    if (!rc) return;
    if (rc->j) { /* the job may still run: it leaves the connection alone from now on */
        pthread_mutex_lock(&rc->j->mu);
        rc->j->conn_gone = true;
        pthread_cond_broadcast(&rc->j->cv);
        pthread_mutex_unlock(&rc->j->mu);
        job_unref(rc->j);
    }
    free(rc->body);
    free(rc);
    *con_cls = NULL;
    atomic_fetch_sub(&s->busy, 1);
    /* a kept-alive connection waits for its next request's head under the short timeout */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, HEAD_TIMEOUT_S < s->o.timeout_s ? HEAD_TIMEOUT_S : s->o.timeout_s);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode toe) {
    (void)cls, (void)socket_ctx;
    if (toe != MHD_CONNECTION_NOTIFY_STARTED) return;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const int sz = SNDBUF_BYTES;
    if (ci) setsockopt(ci->connect_fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz); /* best effort */
}

static void on_mhd_error(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    fputs("hearth serve: http: ", stderr);
    vfprintf(stderr, fmt, ap);
}

int http_start(http_server **out, const http_opts *o, const http_route *routes, void *app, herr *e) {
    struct sockaddr_in6 a6 = {0};
    struct sockaddr_in a4 = {0};
    struct sockaddr *sa;
    /* a pool of polling threads (epoll): an idle socket holds no thread; a request's handler
     * runs on a thread of its own (job_main) while its connection is suspended. ITC:
     * MHD_quiesce_daemon (http_stop) and resuming need it */
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (inet_pton(AF_INET, o->host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)o->port);
        sa = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, o->host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)o->port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        return herr_set(e, "--host: '%s' is no IPv4 or IPv6 address", o->host);
    }
    http_server *s = xcalloc(1, sizeof *s);
    s->routes = routes;
    s->app = app;
    s->o = *o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    /* the connection cap is bounded by the descriptors this process may open: the soft
     * limit raised to the hard one, some kept for the model, the cache and the pool */
    unsigned conn_max = o->conn_max;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
            getrlimit(RLIMIT_NOFILE, &rl);
        }
        if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)conn_max + 128)
            conn_max = rl.rlim_cur > 192 ? (unsigned)rl.rlim_cur - 128 : 64;
    }
    const unsigned per_ip = o->per_ip_max < conn_max ? o->per_ip_max : conn_max;
    const unsigned head_s = HEAD_TIMEOUT_S < o->timeout_s ? HEAD_TIMEOUT_S : o->timeout_s;
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER,
                            on_mhd_error, s, MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_CONNECTION_TIMEOUT, head_s,
                            MHD_OPTION_CONNECTION_LIMIT, conn_max, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)POOL_THREADS,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_MEMORY,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
    if (!s->d) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return herr_set(e, "cannot listen on %s:%d (in use, or not an address of this host)", o->host, o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return 0;
}

int http_port(const http_server *s) { return s->port; }

void http_stop(http_server *s) {
    if (!s) return;
    /* No new connections; the requests under way (the scheduler has ended their generations
     * by now) get up to DRAIN_S to send their end (a stream's last event, a 503), so a client
     * sees a whole response, not a cut one. A client that does not read is cut after that. */
    const MHD_socket ls = MHD_quiesce_daemon(s->d);
    for (const double t0 = time_now(); atomic_load(&s->busy) > 0 && time_now() - t0 < DRAIN_S;) usleep(10000);
    /* Then the jobs still running end: a stream stops producing and ends, a handler returns
     * (the scheduler has stopped, so none waits long); each resumes its connection, as
     * libmicrohttpd stops no daemon with a connection suspended. */
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    while (s->n_jobs > 0) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    MHD_stop_daemon(s->d);
    if (ls != MHD_INVALID_SOCKET) close(ls); /* after the stop: MHD's threads may still use it */
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
