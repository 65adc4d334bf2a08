/* audit.c: the audit daemon in C on zcio's frame ring.
 *
 * Usage: audit FILE KEY N — with a watch rule such as
 *   auditctl -w FILE -p r -k KEY
 * it registers as the audit daemon, forks a child that opens FILE N times (one openat each),
 * and checks that each of those events arrives once and whole (its SYSCALL record first with
 * the rule's key, a PATH record naming FILE, a PROCTITLE record, closed by the kernel's
 * end-of-event record), that no more come after them, and that nothing was lost (the kernel's
 * lost counter, the socket, incomplete events: the counters and the report).
 * Needs CAP_AUDIT_CONTROL in the initial namespaces, and no other audit daemon registered.
 * Freeing the handle unregisters and sets back the enabled flag it turned on.
 * Build: cc audit.c $(pkg-config --cflags --libs zcio) */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zcio.h>

struct tally {
    const char *key_field;  /* key="KEY" */
    const char *name_field; /* name="FILE" */
    int seen, bad, dup, late;
    uint64_t last_serial;
    int done;
};

/* Whether `needle` occurs in the record's fields. */
static int has(const zcio_audit_record *r, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= r->body_len; i++)
        if (memcmp(r->body + i, needle, n) == 0) return 1;
    return 0;
}

static int on_event(const zcio_audit_event *ev, void *user) {
    struct tally *t = user;
    if (ev->nrecords == 0 || ev->records[0].record_type != 1300 ||
        !has(&ev->records[0], t->key_field))
        return 0; /* another event of the host */
    if (t->done) {
        t->late++;
        return 0;
    }
    int path = 0, proctitle = 0;
    for (size_t i = 0; i < ev->nrecords; i++) {
        const zcio_audit_record *r = &ev->records[i];
        /* The fields are a suffix of the text, after its audit(sec.msec:serial) header. */
        if (r->body < r->text || r->body + r->body_len != r->text + r->text_len ||
            memcmp(r->text, "audit(", 6) != 0)
            t->bad++;
        if (r->record_type == 1302 && has(r, t->name_field)) path = 1;
        if (r->record_type == 1327) proctitle = 1;
    }
    if (!path || !proctitle || ev->end != ZCIO_AUDIT_END_EOE || ev->incomplete) t->bad++;
    /* One task's events complete in the order of their serials: a repeat or a step back is a
     * duplicate. */
    if (t->seen > 0 && ev->serial <= t->last_serial) t->dup++;
    t->last_serial = ev->serial;
    t->seen++;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: audit FILE KEY N\n");
        return 2;
    }
    const char *file = argv[1];
    int n = atoi(argv[3]);
    char key_field[256], name_field[4096];
    snprintf(key_field, sizeof key_field, "key=\"%s\"", argv[2]);
    snprintf(name_field, sizeof name_field, "name=\"%s\"", file);
    zcio_audit *a;
    int rc = zcio_audit_open(&a, ZCIO_AUDIT_PRIMARY | ZCIO_AUDIT_NO_FALLBACK, 0);
    if (rc < 0) {
        fprintf(stderr, "zcio_audit_open: %s (%s)\n", strerror(-rc), zcio_last_error());
        return 1;
    }
    zcio_audit_stats st;
    if (zcio_audit_get_stats(a, &st) < 0 || st.mode != ZCIO_AUDIT_PRIMARY) return 1;
    printf("primary via %s\n", zcio_audit_path(a));
    pid_t child = fork();
    if (child == 0) {
        for (int i = 0; i < n; i++) {
            int fd = open(file, O_RDONLY);
            if (fd < 0) _exit(1);
            close(fd);
        }
        _exit(0);
    }
    struct tally t = {key_field, name_field, 0, 0, 0, 0, 0, 0};
    for (int round = 0; round < 1200 && t.seen < n; round++) {
        rc = zcio_audit_process(a, 50, on_event, &t);
        if (rc < 0) {
            fprintf(stderr, "process: %s (%s)\n", strerror(-rc), zcio_last_error());
            return 1;
        }
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status)) return 1;
    /* Anything doubled or late shows now. */
    t.done = 1;
    for (int round = 0; round < 14; round++)
        if (zcio_audit_process(a, 50, on_event, &t) < 0) return 1;
    if (zcio_audit_flush(a, on_event, &t) < 0) return 1;
    if (zcio_audit_get_stats(a, &st) < 0) return 1;
    printf("loss: %s\n", zcio_audit_loss_summary(a));
    /* The report: the same path, events as ops, the loss as JSON. */
    zcio_report *rep;
    if (zcio_audit_report(a, &rep) < 0) return 1;
    zcio_counters c;
    zcio_report_counters(rep, &c);
    const char *json = zcio_report_json(rep);
    printf("report: path %s, ops %llu, fallbacks %zu\n", zcio_report_path(rep),
           (unsigned long long)c.ops, (size_t)zcio_report_fallback_count(rep));
    int report_ok = strcmp(zcio_report_path(rep), zcio_audit_path(a)) == 0 && c.ops == st.events &&
                    strstr(json, "\"mode\":\"primary\"") != NULL &&
                    strstr(json, "\"loss\":{\"at_least\":0,\"at_most\":0,\"exact\":true}") != NULL;
    if (!report_ok) fprintf(stderr, "report: %s\n", json);
    zcio_report_free(rep);
    zcio_audit_free(a);
    if (!report_ok) return 1;
    printf("events %d, bad %d, dup %d, late %d, kernel lost %u -> %u, lost %llu (%s), "
           "incomplete %llu, socket drops %llu, parse errors %llu\n",
           t.seen, t.bad, t.dup, t.late, st.kernel_lost_at_open, st.kernel_lost_now,
           (unsigned long long)st.lost_at_least, st.lost_exact ? "exact" : "a lower bound",
           (unsigned long long)st.incomplete, (unsigned long long)st.kernel_drops,
           (unsigned long long)st.parse_errors);
    if (t.seen != n || t.bad || t.dup || t.late || !st.has_kernel_lost || !st.lost_exact ||
        st.lost_at_least || st.incomplete || st.kernel_drops || st.parse_errors ||
        st.events < (uint64_t)n)
        return 1;
    printf("ok\n");
    return 0;
}
