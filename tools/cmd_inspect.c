/* `ninfer inspect FILE [--json] [--verify]`: what an artifact holds. The reader validates the whole
 * file first, so inspect doubles as a validator; --verify also checks every payload checksum. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "commands.h"
#include "format/artifact.h"

enum { HEAD = 8, STR_SHOW = 60 }; /* array elements and string bytes shown before summarising */

/* ---- text ------------------------------------------------------------------------------------- */

/* A string value, quoted, control and non-ASCII bytes escaped, long ones cut with their length. */
static void put_str(FILE *f, const char *s, uint64_t n)
{
    fputc('"', f);
    for (uint64_t i = 0; i < n && i < STR_SHOW; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20 || c > 0x7e) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputc('"', f);
    if (n > STR_SHOW) fprintf(f, "... (%" PRIu64 " bytes)", n);
}

static void put_scalar(FILE *f, nf_meta_type t, const void *p)
{
    switch (t) {
    case NF_META_U32: fprintf(f, "%" PRIu32, *(const uint32_t *)p); break;
    case NF_META_I32: fprintf(f, "%" PRId32, *(const int32_t *)p); break;
    case NF_META_U64: fprintf(f, "%" PRIu64, *(const uint64_t *)p); break;
    case NF_META_I64: fprintf(f, "%" PRId64, *(const int64_t *)p); break;
    case NF_META_F32: fprintf(f, "%.9g", (double)*(const float *)p); break;
    case NF_META_F64: fprintf(f, "%.17g", *(const double *)p); break;
    case NF_META_BOOL: fputs(*(const uint8_t *)p ? "true" : "false", f); break;
    default: fputs("?", f);
    }
}

static void print_meta(const nf_meta *m)
{
    printf("  %-40s ", m->key);
    if (m->type == NF_META_STRING) {
        printf("string  ");
        put_str(stdout, m->str, m->count);
    } else if (m->type == NF_META_ARRAY) {
        printf("%s[%" PRIu64 "]  ", nf_meta_type_name(m->elem_type), m->count);
        size_t esz = m->elem_type == NF_META_BOOL ? 1 : (m->elem_type == NF_META_U64 || m->elem_type == NF_META_I64 ||
                                                         m->elem_type == NF_META_F64) ? 8 : 4;
        for (uint64_t i = 0; i < m->count && i < HEAD; i++) {
            if (i) fputs(", ", stdout);
            if (m->elem_type == NF_META_STRING) put_str(stdout, m->strs[i], m->str_lens[i]);
            else put_scalar(stdout, m->elem_type, (const uint8_t *)m->elems + i * esz);
        }
        if (m->count > HEAD) printf(", ... (%" PRIu64 " more)", m->count - HEAD);
    } else {
        printf("%-7s ", nf_meta_type_name(m->type));
        uint8_t b = (uint8_t)m->v.b;
        put_scalar(stdout, m->type, m->type == NF_META_BOOL ? (const void *)&b : (const void *)&m->v);
    }
    putchar('\n');
}

static void policy_str(const nf_tensor *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "%s", t->desc.flags & NF_TENSOR_ALLOW_A4 ? "allow_a4" : "-");
    for (uint32_t i = 0; i < t->desc.n_input_divisors && i < 2 && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%g", i ? "," : " in_div=", (double)t->desc.input_divisors[i]);
    if (t->desc.n_input_divisors > 2 && n < cap)
        snprintf(buf + n, cap - n, ",...(%u)", t->desc.n_input_divisors);
}

typedef struct codec_total {
    uint64_t tensors, bytes;
} codec_total;

static void print_text(const nf_artifact *a)
{
    const nf_artifact_info *in = nf_artifact_get_info(a);
    printf("%s: ninfer artifact, format %u.%u, %" PRIu64 " bytes\n", nf_artifact_path(a), in->major, in->minor,
           in->file_bytes);
    printf("  alignment %u, data at %" PRIu64 ", index at %" PRIu64 " (%" PRIu64 " bytes, fnv1a64 0x%016" PRIx64
           ")\n",
           in->alignment, in->data_offset, in->index_offset, in->index_bytes, in->index_checksum);
    printf("\nmetadata (%zu):\n", nf_artifact_n_meta(a));
    for (size_t i = 0; i < nf_artifact_n_meta(a); i++) print_meta(nf_artifact_meta(a, i));
    printf("\ntensors (%zu):\n  %-40s %-6s %-22s %4s %-24s %12s %12s\n", nf_artifact_n_tensors(a), "name", "codec",
           "shape", "div", "policy", "bytes", "offset");
    codec_total tot[NF_CODEC_COUNT] = {{0, 0}};
    uint64_t all = 0;
    for (size_t i = 0; i < nf_artifact_n_tensors(a); i++) {
        const nf_tensor *t = nf_artifact_tensor(a, i);
        char shape[96], pol[96];
        nf_tensor_shape_str(&t->desc, shape, sizeof shape);
        policy_str(t, pol, sizeof pol);
        printf("  %-40s %-6s %-22s %4u %-24s %12" PRIu64 " %12" PRIu64 "\n", t->desc.name, t->codec->name, shape,
               t->desc.divisors, pol, t->layout.payload_bytes, t->offset);
        tot[t->codec->id].tensors++;
        tot[t->codec->id].bytes += t->layout.payload_bytes;
        all += t->layout.payload_bytes;
    }
    printf("\ntotals by codec:\n");
    for (int c = 0; c < NF_CODEC_COUNT; c++)
        if (tot[c].tensors)
            printf("  %-6s %6" PRIu64 " tensors %14" PRIu64 " bytes %6.2f%%\n", nf_codec_get((nf_codec_id)c)->name,
                   tot[c].tensors, tot[c].bytes, all ? 100.0 * (double)tot[c].bytes / (double)all : 0.0);
    printf("  %-6s %6zu tensors %14" PRIu64 " bytes\n", "all", nf_artifact_n_tensors(a), all);
}

/* ---- json ------------------------------------------------------------------------------------- */

static cJSON *json_scalar(nf_meta_type t, const void *p)
{
    switch (t) {
    case NF_META_U32: return cJSON_CreateNumber(*(const uint32_t *)p);
    case NF_META_I32: return cJSON_CreateNumber(*(const int32_t *)p);
    case NF_META_U64: return cJSON_CreateNumber((double)*(const uint64_t *)p); /* exact below 2^53 */
    case NF_META_I64: return cJSON_CreateNumber((double)*(const int64_t *)p);
    case NF_META_F32: return cJSON_CreateNumber(*(const float *)p);
    case NF_META_F64: return cJSON_CreateNumber(*(const double *)p);
    case NF_META_BOOL: return cJSON_CreateBool(*(const uint8_t *)p);
    default: return cJSON_CreateNull();
    }
}

/* Strings may hold any bytes; cJSON takes a C string, so a value with an embedded NUL is cut there
 * (the "bytes" count says so). */
static cJSON *json_meta(const nf_meta *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", nf_meta_type_name(m->type));
    if (m->type == NF_META_STRING) {
        cJSON_AddStringToObject(o, "value", m->str);
        cJSON_AddNumberToObject(o, "bytes", (double)m->count);
    } else if (m->type == NF_META_ARRAY) {
        cJSON_AddStringToObject(o, "elem_type", nf_meta_type_name(m->elem_type));
        cJSON_AddNumberToObject(o, "count", (double)m->count);
        cJSON *v = cJSON_AddArrayToObject(o, m->count > 64 ? "head" : "value");
        size_t esz = m->elem_type == NF_META_BOOL ? 1 : (m->elem_type == NF_META_U64 || m->elem_type == NF_META_I64 ||
                                                         m->elem_type == NF_META_F64) ? 8 : 4;
        for (uint64_t i = 0; i < m->count && i < 64; i++)
            cJSON_AddItemToArray(v, m->elem_type == NF_META_STRING
                                        ? cJSON_CreateString(m->strs[i])
                                        : json_scalar(m->elem_type, (const uint8_t *)m->elems + i * esz));
    } else {
        uint8_t b = (uint8_t)m->v.b;
        cJSON_AddItemToObject(o, "value", json_scalar(m->type, m->type == NF_META_BOOL ? (const void *)&b : (const void *)&m->v));
    }
    return o;
}

static cJSON *json_tensor(const nf_tensor *t)
{
    cJSON *o = cJSON_CreateObject();
    char hex[24];
    cJSON_AddStringToObject(o, "name", t->desc.name);
    cJSON_AddStringToObject(o, "codec", t->codec->name);
    cJSON *shape = cJSON_AddArrayToObject(o, "shape");
    for (uint32_t i = 0; i < t->desc.n_dims; i++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->desc.dims[i]));
    cJSON_AddNumberToObject(o, "divisors", t->desc.divisors);
    cJSON_AddBoolToObject(o, "allow_a4", (t->desc.flags & NF_TENSOR_ALLOW_A4) != 0);
    cJSON *in = cJSON_AddArrayToObject(o, "input_divisors");
    for (uint32_t i = 0; i < t->desc.n_input_divisors; i++)
        cJSON_AddItemToArray(in, cJSON_CreateNumber(t->desc.input_divisors[i]));
    cJSON *planes = cJSON_AddArrayToObject(o, "planes");
    for (uint32_t i = 0; i < t->layout.n_planes; i++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "offset", (double)t->layout.planes[i].offset);
        cJSON_AddNumberToObject(p, "bytes", (double)t->layout.planes[i].bytes);
        cJSON_AddItemToArray(planes, p);
    }
    cJSON_AddNumberToObject(o, "offset", (double)t->offset);
    cJSON_AddNumberToObject(o, "bytes", (double)t->layout.payload_bytes);
    if (t->desc.flags & NF_TENSOR_HAS_CHECKSUM) {
        snprintf(hex, sizeof hex, "%016" PRIx64, t->checksum);
        cJSON_AddStringToObject(o, "fnv1a64", hex);
    }
    return o;
}

static cJSON *json_artifact(const nf_artifact *a)
{
    const nf_artifact_info *in = nf_artifact_get_info(a);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "file", nf_artifact_path(a));
    char ver[16];
    snprintf(ver, sizeof ver, "%u.%u", in->major, in->minor);
    cJSON_AddStringToObject(root, "format_version", ver);
    cJSON_AddNumberToObject(root, "file_bytes", (double)in->file_bytes);
    cJSON_AddNumberToObject(root, "alignment", in->alignment);
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    for (size_t i = 0; i < nf_artifact_n_meta(a); i++)
        cJSON_AddItemToObject(meta, nf_artifact_meta(a, i)->key, json_meta(nf_artifact_meta(a, i)));
    cJSON *ts = cJSON_AddArrayToObject(root, "tensors");
    codec_total tot[NF_CODEC_COUNT] = {{0, 0}};
    for (size_t i = 0; i < nf_artifact_n_tensors(a); i++) {
        const nf_tensor *t = nf_artifact_tensor(a, i);
        cJSON_AddItemToArray(ts, json_tensor(t));
        tot[t->codec->id].tensors++;
        tot[t->codec->id].bytes += t->layout.payload_bytes;
    }
    cJSON *totals = cJSON_AddObjectToObject(root, "totals");
    for (int c = 0; c < NF_CODEC_COUNT; c++) {
        if (!tot[c].tensors) continue;
        cJSON *o = cJSON_AddObjectToObject(totals, nf_codec_get((nf_codec_id)c)->name);
        cJSON_AddNumberToObject(o, "tensors", (double)tot[c].tensors);
        cJSON_AddNumberToObject(o, "bytes", (double)tot[c].bytes);
    }
    return root;
}

/* ---- command ---------------------------------------------------------------------------------- */

int nf_cmd_inspect(int argc, char **argv)
{
    int json = 0, verify = 0;
    const nf_opt opts[] = {
        {"--json", 0, NF_OPT_FLAG, &json, NULL, "print one JSON object (arrays longer than 64 give their head)", 0, 0},
        {"--verify", 0, NF_OPT_FLAG, &verify, NULL, "check every tensor's payload checksum (reads the whole file)", 0,
         0},
    };
    const nf_cmd_usage u = {
        .name = "inspect",
        .synopsis = "FILE [--json] [--verify]",
        .description = "Validate a .nf artifact (header, index, every tensor) and print its metadata, its tensor\n"
                       "table (name, codec, shape, divisors, policies, bytes) and the totals per codec.\n"
                       "Exit status 1 when the file is invalid or a checksum does not match.",
        .opts = opts,
        .n_opts = NF_CLI_COUNT(opts),
        .min_pos = 1,
        .max_pos = 1,
    };
    char *pos[1];
    int npos;
    int r = nf_cli_parse(&u, argc, argv, pos, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;

    nf_artifact *a;
    nf_error e;
    if (nf_artifact_open(pos[0], &a, &e)) return nf_cli_fail("%s", e.msg);
    size_t checked = 0, bad = 0;
    nf_status vs = NF_OK;
    nf_error ve = {0};
    if (verify) vs = nf_artifact_verify(a, &checked, &bad, &ve);
    if (json) {
        cJSON *root = json_artifact(a);
        if (verify) {
            cJSON *v = cJSON_AddObjectToObject(root, "verify");
            cJSON_AddNumberToObject(v, "checked", (double)checked);
            cJSON_AddNumberToObject(v, "mismatched", (double)bad);
            if (vs) cJSON_AddStringToObject(v, "first_error", ve.msg);
        }
        char *s = cJSON_PrintUnformatted(root);
        if (s) puts(s);
        free(s);
        cJSON_Delete(root);
    } else {
        print_text(a);
        if (verify)
            printf("\nverify: %zu of %zu tensors carry a checksum; %zu mismatched\n", checked, nf_artifact_n_tensors(a),
                   bad);
    }
    nf_artifact_close(a);
    if (vs) return nf_cli_fail("%s (%zu of %zu checksums do not match)", ve.msg, bad, checked);
    return 0;
}
