/* What the end-to-end benchmarks (bench e2e, bench batch) print about the model and the device. */
#include "bench_info.h"

#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"

/* "cpu: <model name from /proc/cpuinfo>", "cuda: <GPU, sm, SMs, memory>". */
static void device_desc(const nf_engine *e, char *out, size_t cap)
{
    snprintf(out, cap, "%s", e->ops->name);
    char gpu[160];
    if (strcmp(e->ops->name, "cuda") == 0 && nf_cuda_device_describe(0, gpu, sizeof gpu) == 0)
        snprintf(out, cap, "cuda: %s%s", gpu, e->opts.no_graphs ? ", no graphs" : "");
    if (strcmp(e->ops->name, "cpu") != 0) return;
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && c) {
            c += 1 + (c[1] == ' ');
            c[strcspn(c, "\n")] = 0;
            snprintf(out, cap, "cpu: %s", c);
            break;
        }
    }
    if (f) fclose(f);
}

/* Expert-bank codecs (gate_up/down) and the rest's codecs by share of bytes. */
static void profile(const nf_model *m, char *out, size_t cap)
{
    uint64_t by[NF_CODEC_COUNT] = {0}, total = 0;
    const char *gu = NULL, *dn = NULL;
    for (size_t i = 0; i < nf_artifact_n_tensors(m->art); i++) {
        const nf_tensor *t = nf_artifact_tensor(m->art, i);
        if (strstr(t->desc.name, "_exps")) {
            if (!gu && strstr(t->desc.name, "gate_up")) gu = t->codec->name;
            if (!dn && strstr(t->desc.name, "down")) dn = t->codec->name;
            continue;
        }
        by[t->desc.codec] += t->layout.payload_bytes;
        total += t->layout.payload_bytes;
    }
    size_t o = 0;
    if (gu) o += (size_t)snprintf(out + o, cap - o, "exps %s/%s, ", gu, dn ? dn : "?");
    o += (size_t)snprintf(out + o, cap - o, "rest");
    for (int k = 0; k < 2 * NF_CODEC_COUNT && o < cap; k++) { /* largest share first */
        int best = -1;
        for (int c = 0; c < NF_CODEC_COUNT; c++)
            if (by[c] && (best < 0 || by[c] > by[best])) best = c;
        if (best < 0) break;
        double pct = total ? 100.0 * (double)by[best] / (double)total : 0;
        if (pct >= 0.5) o += (size_t)snprintf(out + o, cap - o, " %s %.0f%%", nf_codec_get(best)->name, pct);
        by[best] = 0;
    }
}

void nf_bench_model_info(const nf_model *m, const nf_engine *e, nf_bench_info *in)
{
    memset(in, 0, sizeof *in);
    const char *src = NULL, *path = nf_artifact_path(m->art), *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (nf_artifact_find_meta(m->art, "provenance.source")) nf_artifact_get_str(m->art, "provenance.source", &src, NULL, NULL);
    in->synthetic = src && strncmp(src, "synth:", 6) == 0;
    if (in->synthetic)
        snprintf(in->model, sizeof in->model, "%s %uL (%.*s)", nf_arch_name(m->cfg.arch), m->cfg.layers,
                 (int)strcspn(src, " "), src);
    else
        snprintf(in->model, sizeof in->model, "%s %uL (%s)", nf_arch_name(m->cfg.arch), m->cfg.layers, base);
    in->file_bytes = nf_artifact_get_info(m->art)->file_bytes;
    for (size_t i = 0; i < nf_artifact_n_tensors(m->art); i++) {
        const nf_tensor *t = nf_artifact_tensor(m->art, i);
        uint64_t n = 1;
        for (uint32_t k = 0; k < t->desc.n_dims; k++) n *= t->desc.dims[k];
        in->params += n;
    }
    in->gb_per_token = (double)nf_model_bytes_per_token(m) * 1e-9;
    profile(m, in->profile, sizeof in->profile);
    device_desc(e, in->device, sizeof in->device);
}

void nf_bench_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
    fputc('"', f);
}

/* "17.69 GiB", or MiB below one GiB. */
const char *nf_bench_size_str(uint64_t b, char *buf, size_t cap)
{
    const double gib = (double)b / (1024.0 * 1024 * 1024);
    if (gib >= 1) snprintf(buf, cap, "%.2f GiB", gib);
    else snprintf(buf, cap, "%.2f MiB", (double)b / (1024.0 * 1024));
    return buf;
}

