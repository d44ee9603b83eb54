/* replay.c: the main() a fuzz target gets when it is built without libFuzzer (the ASan +
 * UBSan build, `make fuzz-replay`): runs LLVMFuzzerTestOneInput once on each file named
 * (a folder: each file in it), so the corpus and the regressions replay in CI in seconds.
 * Prints "N passed, 0 failed"; any memory error or broken property aborts the run. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return -1; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    /* an exact-size heap copy, so a read one past the end is an ASan report */
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    if (n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) { perror(path); fclose(f); free(b); return -1; }
    fclose(f);
    LLVMFuzzerTestOneInput(b, (size_t)n);
    free(b);
    return 0;
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int n = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) < 0) { perror(argv[i]); bad++; continue; }
        if (!S_ISDIR(sb.st_mode)) {
            if (run_file(argv[i]) < 0) bad++; else n++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], de->d_name);
            if (run_file(path) < 0) bad++; else n++;
        }
        if (d) closedir(d);
    }
    printf("%d passed, %d failed\n", n, bad);
    return bad != 0;
}
