// The CPU floor of a fresh sandbox on this host, without Bulkhead: what the kernel alone charges
// for the namespaces and mounts a jail sandbox needs, and for tearing them down. Compared in the
// same run with a plain fork + exec of the same program, so the ratio says what isolation costs.
//
// Per iteration: clone into new user/pid/mount/net/ipc/uts/cgroup namespaces, write the id maps,
// mount an overlay root (lower: this host's /usr, upper: a fresh tmpfs), /proc, a tmpfs /dev with six
// device binds and devpts, /dev/shm, /tmp, /run, two binds (like the agent binary and its socket
// directory), the jail's /proc masks (22 mounts, as many as a jail sandbox), pivot_root, exec
// /bin/true; then the parent reaps it. CPU is system-wide busy time from /proc/stat, so kernel
// workers (netns and mount cleanup) count. Root only.
//
//   gcc -O2 -o /tmp/ns-floor bench/ns-floor.c && /tmp/ns-floor 200
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char stack[1 << 16];
static int gate[2];
static const char *scratch;

static void die(const char *what) {
    fprintf(stderr, "ns-floor: %s: %s\n", what, strerror(errno));
    _exit(111);
}

static void mnt(const char *src, const char *dst, const char *fs, unsigned long fl, const char *data) {
    if (mount(src, dst, fs, fl, data) != 0) die(dst);
}

static int child(void *arg) {
    (void)arg;
    char c;
    close(gate[1]);
    if (read(gate[0], &c, 1) != 1) die("gate");
    // Become the namespace's root (host uid 70000000), as the jail's init does.
    if (setresgid(0, 0, 0) != 0 || setresuid(0, 0, 0) != 0) die("setresuid");
    char up[256], work[256], root[256], p[1024];
    mnt(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    snprintf(root, sizeof root, "%s/root", scratch);
    mnt("tmpfs", scratch, "tmpfs", 0, "size=16m");
    snprintf(up, sizeof up, "%s/up", scratch);
    snprintf(work, sizeof work, "%s/work", scratch);
    if (mkdir(up, 0755) != 0 || mkdir(work, 0755) != 0 || mkdir(root, 0755) != 0) die("mkdir");
    snprintf(p, sizeof p, "lowerdir=/usr,upperdir=%s,workdir=%s,userxattr", up, work);
    mnt("overlay", root, "overlay", 0, p);
    const char *dirs[] = {"proc", "dev", "tmp", "run", "oldroot"};
    for (size_t i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", root, dirs[i]);
        mkdir(p, 0755);
    }
    snprintf(p, sizeof p, "%s/proc", root);
    mnt("proc", p, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    snprintf(p, sizeof p, "%s/dev", root);
    mnt("tmpfs", p, "tmpfs", MS_NOSUID, "mode=755,size=64k");
    const char *devs[] = {"null", "zero", "full", "random", "urandom", "tty"};
    for (size_t i = 0; i < 6; i++) {
        char src[64];
        snprintf(src, sizeof src, "/dev/%s", devs[i]);
        snprintf(p, sizeof p, "%s/dev/%s", root, devs[i]);
        close(open(p, O_CREAT | O_WRONLY, 0666));
        mnt(src, p, NULL, MS_BIND, NULL);
    }
    snprintf(p, sizeof p, "%s/dev/pts", root);
    mkdir(p, 0755);
    mnt("devpts", p, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666");
    snprintf(p, sizeof p, "%s/dev/shm", root);
    mkdir(p, 01777);
    mnt("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m");
    snprintf(p, sizeof p, "%s/tmp", root);
    mnt("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m");
    snprintf(p, sizeof p, "%s/run", root);
    mnt("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV, "size=8m");
    // Like the agent binary and its socket directory.
    snprintf(p, sizeof p, "%s/run/agent", root);
    close(open(p, O_CREAT | O_WRONLY, 0755));
    mnt("/bin/true", p, NULL, MS_BIND, NULL);
    snprintf(p, sizeof p, "%s/run/sock", root);
    mkdir(p, 0755);
    mnt("/tmp", p, NULL, MS_BIND, NULL);
    // The jail's /proc masks: files behind /dev/null, a directory behind an empty tmpfs, four
    // subtrees read-only (each a bind and a remount).
    const char *masks[] = {"keys", "timer_list"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/proc/%s", root, masks[i]);
        mnt("/dev/null", p, NULL, MS_BIND, NULL);
    }
    snprintf(p, sizeof p, "%s/proc/acpi", root);
    mnt("tmpfs", p, "tmpfs", MS_RDONLY, "size=0");
    const char *ro[] = {"sys", "bus", "fs", "irq"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/proc/%s", root, ro[i]);
        mnt(p, p, NULL, MS_BIND | MS_REC, NULL);
        mnt(NULL, p, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL);
    }
    snprintf(p, sizeof p, "%s/oldroot", root);
    if (syscall(SYS_pivot_root, root, p) != 0) die("pivot_root");
    if (chdir("/") != 0) die("chdir");
    if (umount2("/oldroot", MNT_DETACH) != 0) die("umount oldroot");
    execl("/bin/true", "true", (char *)NULL);
    die("exec");
    return 1;
}

static void write_file(const char *path, const char *s) {
    int fd = open(path, O_WRONLY);
    if (fd < 0 || write(fd, s, strlen(s)) != (ssize_t)strlen(s)) die(path);
    close(fd);
}

static void one_sandbox(void) {
    if (pipe(gate) != 0) die("pipe");
    int flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS |
                CLONE_NEWCGROUP | SIGCHLD;
    pid_t pid = clone(child, stack + sizeof stack, flags, NULL);
    if (pid < 0) die("clone");
    close(gate[0]);
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/uid_map", pid);
    write_file(p, "0 70000000 65536");
    snprintf(p, sizeof p, "/proc/%d/setgroups", pid);
    write_file(p, "deny");
    snprintf(p, sizeof p, "/proc/%d/gid_map", pid);
    write_file(p, "0 70000000 65536");
    if (write(gate[1], "g", 1) != 1) die("release");
    close(gate[1]);
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "ns-floor: sandbox failed (status %d)\n", st);
        exit(1);
    }
}

static void plain(void) {
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/true", "true", (char *)NULL);
        _exit(111);
    }
    waitpid(pid, NULL, 0);
}

static double busy_ms(void) {
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f || fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) != 8) die("/proc/stat");
    fclose(f);
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) * 1000.0 / sysconf(_SC_CLK_TCK);
}

static double run(void (*fn)(void), int n) {
    sleep(1); // let the previous batch's deferred kernel cleanup finish
    double a = busy_ms();
    for (int i = 0; i < n; i++) fn();
    sleep(1); // and count this batch's
    return (busy_ms() - a) / n;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 200;
    char tmpl[] = "/tmp/ns-floor-XXXXXX";
    scratch = mkdtemp(tmpl);
    if (!scratch || chmod(scratch, 0777) != 0) die("scratch");
    one_sandbox(); // warm-up, and a check that it works
    double base = run(plain, n);
    double sb = run(one_sandbox, n);
    // An idle machine's background busy time over the two 1 s pauses is counted in both.
    printf("fork+exec /bin/true:                  %.2f ms CPU (system-wide busy / iteration, n=%d)\n", base, n);
    printf("fresh namespaces + 22 mounts + exec:  %.2f ms CPU (%.1fx)\n", sb, sb / base);
    rmdir(scratch);
    return 0;
}
