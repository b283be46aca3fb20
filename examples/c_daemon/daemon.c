/* A small worker daemon of the shape of raylet or orted: it forks N workers and execs each with a
 * FILTERED environment, built from an allow-list of names (NAME or PREFIX*), or its whole own
 * environment ("*").
 *
 *   daemon [-w] -n N -k LIST -- PROGRAM ARGS...
 *
 *   -n N     workers to start
 *   -k LIST  comma-separated allow-list: PATH,HOME,NCCL_* ; "*" passes everything
 *   -w       wait for one line on stdin before starting them (a driver's "start workers" request)
 *
 * PROGRAM is exec'ed as given (execve: no PATH search). Exits 0 when every worker exited 0.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int allowed(const char *entry, const char *list) {
    size_t name_len = strcspn(entry, "=");
    char *copy = strdup(list), *save = NULL;
    int ok = 0;
    for (char *item = strtok_r(copy, ",", &save); item && !ok; item = strtok_r(NULL, ",", &save)) {
        size_t n = strlen(item);
        if (n && item[n - 1] == '*')
            ok = name_len >= n - 1 && strncmp(entry, item, n - 1) == 0;
        else
            ok = name_len == n && strncmp(entry, item, n) == 0;
    }
    free(copy);
    return ok;
}

static char **filtered(const char *list) {
    size_t n = 0, k = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 1, sizeof *env);
    for (size_t i = 0; i < n; i++)
        if (allowed(environ[i], list)) env[k++] = environ[i];
    return env;
}

int main(int argc, char **argv) {
    int workers = 1, wait_stdin = 0, opt;
    const char *keep = "PATH";
    while ((opt = getopt(argc, argv, "wn:k:")) != -1) {
        if (opt == 'w') wait_stdin = 1;
        else if (opt == 'n') workers = atoi(optarg);
        else if (opt == 'k') keep = optarg;
        else return 2;
    }
    if (optind >= argc) {
        fprintf(stderr, "usage: %s [-w] -n N -k LIST -- PROGRAM ARGS...\n", argv[0]);
        return 2;
    }
    if (wait_stdin) {
        char line[64];
        if (!fgets(line, sizeof line, stdin)) return 3; /* the driver went away */
    }
    char **env = filtered(keep);
    for (int i = 0; i < workers; i++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        if (pid == 0) {
            execve(argv[optind], argv + optind, env);
            perror("execve");
            _exit(127);
        }
    }
    int status, failed = 0;
    while (wait(&status) > 0)
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    return failed;
}
