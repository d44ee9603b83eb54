/* http.c: libmicrohttpd under the route table of http.h. */
#include "serve/http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define DRAIN_S 2.0 /* at http_stop, how long the requests under way get to send their end */
/* Each connection's kernel send buffer (the kernel doubles it): a fixed size instead of
 * autotuning up to tcp_wmem's 4 MiB, so a client that stops reading holds little kernel
 * memory and its stream stalls soon, to be cut after the timeout. Ample for an SSE stream. */
#define SNDBUF_BYTES (128 << 10)

struct http_server {
    struct MHD_Daemon *d;
    const http_route *routes;
    void *app;
    http_opts o;
    int port;
    atomic_int busy;        /* requests under way: from their headers to on_completed */
};

/* one request's state across the access handler's calls */
typedef struct req_ctx {
    char *body;
    size_t len, cap;
    bool too_big;
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

/* -------------------------------------------------------------- streams */

typedef struct stream {
    http_out out;
} stream;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *s = cls;
    for (;;) {
        ssize_t n = s->out.produce(s->out.cls, buf, max);
        if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        if (n > 0) return n;
    }
}

static void stream_free(void *cls) {
    stream *s = cls;
    if (s->out.done) s->out.done(s->out.cls);
    free(s);
}

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

static enum MHD_Result send_out(struct MHD_Connection *conn, http_out *o) {
    struct MHD_Response *r;
    if (o->produce) {
        stream *st = xmalloc(sizeof *st);
        st->out = *o;
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
    } else {
        r = o->body ? MHD_create_response_from_buffer(o->len, o->body, MHD_RESPMEM_MUST_FREE)
                    : MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    }
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", o->content_type ? o->content_type : "application/json");
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    if (o->produce) MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)o->status, r);
    MHD_destroy_response(r);
    return ret;
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
        return MHD_YES;
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
        const bool match = r->path[n - 1] == '/' ? !strncmp(url, r->path, n) : !strcmp(url, r->path);
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
    if (!hit && path_known) http_error(&o, &c, 405, "invalid_request_error", "%s does not take %s", url, method);
    else if (!hit) http_error(&o, &c, 404, "not_found_error", "no such endpoint: %s %s", method, url);
    else if (!hit->open && !authorized(s, &c)) http_error(&o, &c, 401, "authentication_error", "invalid API key");
    else if (rc->too_big)
        http_error(&o, &c, 413, "invalid_request_error", "the request body is over %zu bytes", s->o.body_max);
    else hit->fn(s->app, &c, &o);
    return send_out(conn, &o);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)conn, (void)toe;
    http_server *s = cls;
    req_ctx *rc = *con_cls;
    if (!rc) return;
    free(rc->body);
    free(rc);
    *con_cls = NULL;
    atomic_fetch_sub(&s->busy, 1);
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
    /* ITC: MHD_quiesce_daemon (http_stop) needs it with an internal polling thread */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC;
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
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER,
                            on_mhd_error, s, MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s,
                            MHD_OPTION_CONNECTION_LIMIT, o->conn_max, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
    if (!s->d) {
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
    MHD_stop_daemon(s->d);
    if (ls != MHD_INVALID_SOCKET) close(ls); /* after the stop: MHD's threads may still use it */
    free(s);
}
