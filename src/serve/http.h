/* http.h: the server's HTTP side on libmicrohttpd (a pool of polling threads; a thread per
 * request being handled, none per idle connection): a route table, request bodies under a
 * size limit, the API key, JSON and error bodies, and streamed (server-sent events)
 * responses whose producer may block.
 *
 * Every failure a client can cause is answered, not asserted: an unknown path (404), a
 * method the path does not take (405), a body over the limit (413), a wrong or missing key
 * (401, compared in constant time), each with an OpenAI-style error body, or Anthropic's
 * shape on /v1/messages; header lines over 64 KiB get 431 (libmicrohttpd's own HTML errors
 * remain for heads over its 256 KiB buffer and for broken request lines). A request's head
 * and body must come within 10 s (or the timeout, if shorter); an answer being sent waits up
 * to the timeout for a reader that stopped; a generation under way has no timeout. Each
 * client address holds at most per_ip_max connections. */
#ifndef HEARTH_SERVE_HTTP_H
#define HEARTH_SERVE_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <cjson/cJSON.h>

#include "base/util.h"

typedef struct http_server http_server;

/* One request, as a handler sees it. */
typedef struct http_call {
    void *conn;             /* the MHD connection (http_client_gone, http_header) */
    const char *method;
    const char *url;        /* path, no query */
    const char *body;       /* NUL-terminated */
    size_t body_len;
    bool anthropic;         /* error bodies in Anthropic's shape */
} http_call;

/* What a handler answers: a body (malloc'd, taken over), or a stream: produce() is called
 * again and again on the request's thread and may block; it returns the bytes it wrote
 * into buf (at most max; 0 is allowed and means "nothing yet"), or -1 at the end.
 * done() is called once when the connection ends, finished or not (the client went away). */
typedef struct http_out {
    int status;
    const char *content_type;
    char *body;
    size_t len;
    ssize_t (*produce)(void *cls, char *buf, size_t max);
    void (*done)(void *cls);
    void *cls;
} http_out;

typedef void (*http_handler)(void *app, const http_call *c, http_out *out);

typedef struct http_route {
    const char *method;     /* "GET", "POST" */
    const char *path;       /* exact, or a prefix when it ends in '/' ("/" itself: exact) */
    http_handler fn;
    bool open;              /* served without the API key (/health) */
} http_route;

typedef struct http_opts {
    const char *host;
    int port;               /* 0: any free port (http_port says which) */
    size_t body_max;        /* bytes */
    unsigned timeout_s;     /* an answer's reader stalled this long is cut off */
    unsigned conn_max;      /* connections open at once (lowered to what RLIMIT_NOFILE allows) */
    unsigned per_ip_max;    /* of them from one address */
    const char *api_key;    /* NULL: none needed */
} http_opts;

int http_start(http_server **out, const http_opts *o, const http_route *routes, void *app, herr *e);
int http_port(const http_server *s);
/* Stops listening, lets the requests under way finish sending (2 s at most), waits for the
 * requests' threads to end, then closes every connection. */
void http_stop(http_server *s);

/* Answers: JSON (j is printed and deleted), an error with the body shape of c. */
void http_json(http_out *o, int status, cJSON *j);
void http_error(http_out *o, const http_call *c, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* true when the peer closed its side (polls the socket; for handlers that wait) */
bool http_client_gone(const http_call *c);
/* a request header, or a query argument; NULL when absent */
const char *http_header(const http_call *c, const char *name);
const char *http_query(const http_call *c, const char *name);

#endif
