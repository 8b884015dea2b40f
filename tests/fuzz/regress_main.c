/* A plain main() for the fuzz targets' bodies (no libFuzzer): every file named on the command line,
 * or inside a folder named there, is fed once to LLVMFuzzerTestOneInput, the same function the fuzzer
 * runs. A body signals a broken invariant with abort() and the sanitizers catch memory errors, so a
 * pass means every input was refused cleanly or read in full. Each input sits in a buffer of exactly
 * its size, so ASan sees a one-byte overread. Folders' *.md and dot files are skipped; finding no
 * input at all fails (a moved fixture folder must not turn the test into a no-op). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    int bad = n < 0 || !buf || fread(buf, 1, (size_t)n, f) != (size_t)n;
    fclose(f);
    if (!bad) LLVMFuzzerTestOneInput(buf, (size_t)n);
    else fprintf(stderr, "%s: cannot read\n", path);
    free(buf);
    return bad;
}

static int skipped(const char *name) { return name[0] == '.' || strstr(name, ".md") != NULL; }

/* Feeds `path` (a file, or every file of a folder); adds to *files, returns the number of failures. */
static int run_path(const char *path, int *files)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: no such file or folder\n", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) return ++*files, run_file(path);
    DIR *d = opendir(path);
    if (!d) return 1;
    int bad = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (skipped(e->d_name) || stat(p, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        ++*files;
        bad += run_file(p);
    }
    closedir(d);
    return bad;
}

int main(int argc, char **argv)
{
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) bad += run_path(argv[i], &files);
    printf("%d inputs, %d unreadable\n", files, bad);
    return files == 0 || bad ? 1 : 0;
}
