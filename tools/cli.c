#include "cli.h"

#include "commands.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int nf_cli_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ninfer: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

void nf_cli_print_help(const nf_cmd_usage *u, FILE *f)
{
    fprintf(f, "usage: ninfer %s %s\n", u->name, u->synopsis ? u->synopsis : "");
    if (u->description) fprintf(f, "\n%s\n", u->description);
    fprintf(f, "\noptions:\n");
    for (int i = 0; i < u->n_opts; i++) {
        const nf_opt *o = &u->opts[i];
        char left[64];
        if (o->short_name)
            snprintf(left, sizeof left, "-%c, %s%s%s", o->short_name, o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
        else
            snprintf(left, sizeof left, "    %s%s%s", o->name, o->metavar ? " " : "", o->metavar ? o->metavar : "");
        fprintf(f, "  %-28s %s\n", left, o->help ? o->help : "");
    }
    fprintf(f, "  %-28s %s\n", "-h, --help", "show this help");
}

static int usage_error(const nf_cmd_usage *u, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ninfer %s: error: ", u->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fprintf(stderr, "usage: ninfer %s %s\n(see 'ninfer %s --help')\n", u->name, u->synopsis ? u->synopsis : "",
            u->name);
    return NF_CLI_ERROR;
}

static const nf_opt *find_opt(const nf_cmd_usage *u, const char *arg)
{
    for (int i = 0; i < u->n_opts; i++) {
        const nf_opt *o = &u->opts[i];
        if (strcmp(arg, o->name) == 0) return o;
        if (o->short_name && arg[0] == '-' && arg[1] == o->short_name && arg[2] == '\0') return o;
    }
    return NULL;
}

static int bounded(const nf_opt *o, double v) { return (o->min == 0 && o->max == 0) || (v >= o->min && v <= o->max); }

static int set_value(const nf_cmd_usage *u, const nf_opt *o, const char *val)
{
    char *end = NULL;
    errno = 0;
    switch (o->kind) {
    case NF_OPT_INT: {
        long v = strtol(val, &end, 10);
        if (errno || end == val || *end) return usage_error(u, "%s: expected an integer, got '%s'", o->name, val);
        if (!bounded(o, (double)v))
            return usage_error(u, "%s: %ld is outside [%.0f, %.0f]", o->name, v, o->min, o->max);
        *(long *)o->dest = v;
        return NF_CLI_OK;
    }
    case NF_OPT_FLOAT: {
        double v = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(v))
            return usage_error(u, "%s: expected a number, got '%s'", o->name, val);
        if (!bounded(o, v)) return usage_error(u, "%s: %g is outside [%g, %g]", o->name, v, o->min, o->max);
        *(double *)o->dest = v;
        return NF_CLI_OK;
    }
    case NF_OPT_STRING: *(const char **)o->dest = val; return NF_CLI_OK;
    case NF_OPT_FLAG: break;
    }
    return usage_error(u, "%s: internal error: bad option kind", o->name);
}

int nf_cli_parse(const nf_cmd_usage *u, int argc, char **argv, char **pos, int *npos)
{
    *npos = 0;
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (!only_pos && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            nf_cli_print_help(u, stdout);
            return NF_CLI_HELP;
        }
        if (!only_pos && strcmp(a, "--") == 0) {
            only_pos = 1;
            continue;
        }
        if (!only_pos && a[0] == '-' && a[1] != '\0') {
            /* "--name=value" form */
            char name[64];
            const char *inline_val = NULL;
            const char *eq = strchr(a, '=');
            if (a[1] == '-' && eq && (size_t)(eq - a) < sizeof name) {
                memcpy(name, a, (size_t)(eq - a));
                name[eq - a] = '\0';
                inline_val = eq + 1;
            } else {
                snprintf(name, sizeof name, "%s", a);
            }
            const nf_opt *o = find_opt(u, name);
            if (!o) return usage_error(u, "unknown option '%s'", a);
            if (o->kind == NF_OPT_FLAG) {
                if (inline_val) return usage_error(u, "%s takes no value", o->name);
                *(int *)o->dest = 1;
                continue;
            }
            const char *val = inline_val;
            if (!val) {
                if (i + 1 >= argc) return usage_error(u, "%s needs a value (%s)", o->name, o->metavar ? o->metavar : "");
                val = argv[++i];
            }
            int r = set_value(u, o, val);
            if (r) return r;
            continue;
        }
        if (*npos >= u->max_pos) return usage_error(u, "unexpected argument '%s'", a);
        pos[(*npos)++] = a;
    }
    if (*npos < u->min_pos) return usage_error(u, "missing argument (expected %d, got %d)", u->min_pos, *npos);
    return NF_CLI_OK;
}

static void dispatch_usage(const nf_dispatch *d, FILE *f)
{
    fprintf(f, "%s\n%s:\n", d->usage, d->heading);
    for (size_t i = 0; i < d->n; i++) fprintf(f, "  %-12s %s\n", d->table[i].name, d->table[i].summary);
    fprintf(f, "\n%s\n", d->footer);
}

int nf_cli_dispatch(const nf_dispatch *d, int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "%s: error: no %s given\n", d->prog, d->noun);
        dispatch_usage(d, stderr);
        return 2;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        dispatch_usage(d, stdout);
        return 0;
    }
    for (size_t i = 0; i < d->n; i++)
        if (strcmp(name, d->table[i].name) == 0) return d->table[i].run(argc - 1, argv + 1);
    fprintf(stderr, "%s: error: unknown %s '%s'\n", d->prog, name[0] == '-' ? "option" : d->noun, name);
    dispatch_usage(d, stderr);
    return 2;
}
