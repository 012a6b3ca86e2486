# shellcheck shell=bash
# Local services for taskstream's tests, benchmarks and fault runs. Source this file, then call:
#
#   ensure_redis      Redis on 127.0.0.1:${TASKSTREAM_TEST_REDIS_PORT:-6379}
#                     -> exports TASKSTREAM_TEST_REDIS_URL
#   ensure_mariadb    MariaDB/MySQL on 127.0.0.1:${TASKSTREAM_TEST_MYSQL_PORT:-3306}, root with an
#                     empty password over TCP, database `test`
#                     -> exports TASKSTREAM_TEST_MYSQL_URL
#   detect_postgres   PostgreSQL on 127.0.0.1:${TASKSTREAM_TEST_POSTGRES_PORT:-5432} if one answers
#                     -> exports TASKSTREAM_TEST_POSTGRES_URL, or unsets it
#   ensure_faketime   libfaketime (clock-skew fault runs); as root, installs Debian's `faketime`
#                     -> exports TASKSTREAM_TEST_LIBFAKETIME (path of libfaketime.so.1)
#
# Each one uses a server that already answers; otherwise it starts a local binary; otherwise, as
# root with apt-get, it installs the Debian package first. PostgreSQL is never installed or
# started. Everything is idempotent. Servers started here bind to 127.0.0.1 only and keep their
# files and logs under ${TASKSTREAM_SERVICE_DIR:-${TMPDIR:-/tmp}/taskstream-services-$UID}, except
# MariaDB on its default port 3306, which uses Debian's own layout (/var/lib/mysql, /run/mysqld).
# TASKSTREAM_PYTHON names the interpreter used for database probes when no client is installed.

say() { printf '    %s\n' "$*"; }
die() {
	printf 'error: %s\n' "$*" >&2
	exit 1
}

service_dir() {
	local dir=${TASKSTREAM_SERVICE_DIR:-${TMPDIR:-/tmp}/taskstream-services-$(id -u)}
	mkdir -p "$dir"
	printf '%s\n' "$dir"
}

# find_bin NAME...: path of the first NAME on PATH or in an sbin directory.
find_bin() {
	local name dir
	for name in "$@"; do
		command -v "$name" 2>/dev/null && return 0
		for dir in /usr/sbin /usr/local/sbin /sbin; do
			[[ -x $dir/$name ]] && printf '%s\n' "$dir/$name" && return 0
		done
	done
	return 1
}

# apt_install PACKAGE...: only as root where apt-get exists; `apt-get update` once per process.
apt_install() {
	[[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null || return 1
	if [[ -z ${_TASKSTREAM_APT_UPDATED:-} ]]; then
		say "apt-get update"
		apt-get update -q >/dev/null || return 1
		_TASKSTREAM_APT_UPDATED=1
	fi
	say "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" >/dev/null
}

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
	# shellcheck disable=SC2016  # $0 expands in the inner shell
	timeout 3 bash -c ': <>"/dev/tcp/127.0.0.1/$0"' "$1" 2>/dev/null
}

# wait_until SECONDS PID CMD...: run CMD every 0.5 s until it succeeds; give up after SECONDS,
# or as soon as PID (when not empty) has exited.
wait_until() {
	local tries=$(($1 * 2)) pid=$2
	shift 2
	while ((tries-- > 0)); do
		"$@" && return 0
		[[ -z $pid ]] || kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.5
	done
	return 1
}

# run_user: the account a database server started by root runs as; empty when not root.
run_user() {
	[[ $(id -u) -eq 0 ]] || return 0
	if id -u mysql >/dev/null 2>&1; then echo mysql; else echo root; fi
}

# --- Redis ---------------------------------------------------------------------------------

redis_ping() {
	local reply
	# shellcheck disable=SC2016  # $0 expands in the inner shell
	reply=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" && printf "PING\r\n" >&3 &&
		IFS= read -r line <&3 && printf %s "$line"' "$1" 2>/dev/null) || return 1
	[[ $reply == +PONG* ]]
}

redis_start() {
	local bin=$1 port=$2 dir
	dir=$(service_dir)
	say "redis: starting $bin on 127.0.0.1:$port (log: $dir/redis-$port.log)"
	"$bin" --daemonize yes --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
		--dir "$dir" --logfile "$dir/redis-$port.log" --pidfile "$dir/redis-$port.pid" ||
		die "$bin failed to start; see $dir/redis-$port.log"
	wait_until 10 "" redis_ping "$port" ||
		die "redis did not answer on 127.0.0.1:$port within 10 s; see $dir/redis-$port.log"
}

ensure_redis() {
	local port=${TASKSTREAM_TEST_REDIS_PORT:-6379} bin
	if redis_ping "$port"; then
		say "redis: using the server on 127.0.0.1:$port"
	else
		port_open "$port" &&
			die "127.0.0.1:$port is open but does not answer PING with PONG (password? not Redis?)"
		bin=$(find_bin redis-server valkey-server) ||
			{ apt_install redis-server && bin=$(find_bin redis-server); } ||
			die "no Redis on 127.0.0.1:$port and no redis-server/valkey-server to start (install redis-server)"
		# A freshly installed package may have started its own server already.
		redis_ping "$port" || redis_start "$bin" "$port"
	fi
	export TASKSTREAM_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
}

# --- MariaDB / MySQL -----------------------------------------------------------------------

# mariadb_layout PORT: sets TS_MY_OPTS (leading option-file flag), TS_MY_DATADIR, TS_MY_RUNDIR,
# and TS_MY_INIT_OPTS: a private datadir gets a root that needs no password from the start.
mariadb_layout() {
	if [[ $1 == 3306 ]]; then
		TS_MY_OPTS=() TS_MY_INIT_OPTS=() TS_MY_DATADIR=/var/lib/mysql TS_MY_RUNDIR=/run/mysqld
	else
		TS_MY_OPTS=(--no-defaults) TS_MY_INIT_OPTS=(--auth-root-authentication-method=normal)
		TS_MY_RUNDIR="$(service_dir)/mariadb-$1" TS_MY_DATADIR="$(service_dir)/mariadb-$1/data"
	fi
}

# mysql_tcp PORT SQL: run SQL as root with an empty password over TCP.
mysql_tcp() {
	local client
	if client=$(find_bin mariadb mysql); then
		"$client" --no-defaults --protocol=TCP -h 127.0.0.1 -P "$1" -u root --connect-timeout=5 \
			-e "$2" >/dev/null
	else
		"${TASKSTREAM_PYTHON:-python3}" - "$1" "$2" <<'PY'
import asyncio
import logging
import sys

import asyncmy

logging.disable(logging.WARNING)  # notes such as "database exists"


async def main() -> None:
    conn = await asyncmy.connect(
        host="127.0.0.1", port=int(sys.argv[1]), user="root", password="", connect_timeout=5
    )
    async with conn.cursor() as cur:
        await cur.execute(sys.argv[2])
    conn.close()


try:
    asyncio.run(main())
except Exception as exc:
    sys.exit(f"mysql via asyncmy: {exc!r}")
PY
	fi
}

# mysql_socket SQL: run SQL as the database root through the unix socket (unix_socket auth).
mysql_socket() {
	local client
	client=$(find_bin mariadb mysql) || return 1
	"$client" --no-defaults -u root --socket="$TS_MY_RUNDIR/mysqld.sock" -e "$1" >/dev/null
}

# mariadb_root_login PORT: make `root` with an empty password work over TCP 127.0.0.1. Changes
# accounts only when that login fails and the socket admits the database root.
mariadb_root_login() {
	mysql_tcp "$1" 'SELECT 1' 2>/dev/null && return 0
	[[ -S $TS_MY_RUNDIR/mysqld.sock ]] || return 1
	say "mariadb: adding root@127.0.0.1 with an empty password"
	mysql_socket "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
		GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;" || return 1
	mysql_tcp "$1" 'SELECT 1' 2>/dev/null && return 0
	say "mariadb: letting root@localhost log in with an empty password too"
	mysql_socket "ALTER USER 'root'@'localhost'
		IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')" || return 1
	mysql_tcp "$1" 'SELECT 1'
}

# mariadb_init_datadir BIN USER LOG: create the system tables when the datadir has none.
mariadb_init_datadir() {
	[[ -d $TS_MY_DATADIR/mysql ]] && return 0
	local tool opts=("${TS_MY_OPTS[@]}" "--datadir=$TS_MY_DATADIR")
	[[ -z $2 ]] || opts+=("--user=$2")
	say "mariadb: initialising $TS_MY_DATADIR"
	if tool=$(find_bin mariadb-install-db mysql_install_db); then
		"$tool" "${opts[@]}" "${TS_MY_INIT_OPTS[@]}" >>"$3" 2>&1
	else
		"$1" "${opts[@]}" --initialize-insecure >>"$3" 2>&1
	fi || die "could not initialise $TS_MY_DATADIR; see $3"
}

# mariadb_launch BIN PORT USER LOG: start the server detached; prints its pid.
mariadb_launch() {
	local opts=("${TS_MY_OPTS[@]}" "--datadir=$TS_MY_DATADIR" "--port=$2"
		"--socket=$TS_MY_RUNDIR/mysqld.sock" "--pid-file=$TS_MY_RUNDIR/mysqld.pid"
		--bind-address=127.0.0.1 "--log-error=$4")
	[[ -z $3 ]] || opts+=("--user=$3")
	setsid "$1" "${opts[@]}" >>"$4" 2>&1 </dev/null &
	echo "$!"
}

mariadb_start() {
	local port=$1 bin user log pid
	bin=$(find_bin mariadbd mysqld) ||
		{ apt_install mariadb-server && bin=$(find_bin mariadbd mysqld); } ||
		die "no MariaDB/MySQL on 127.0.0.1:$port and no mariadbd/mysqld to start (install mariadb-server)"
	# A freshly installed package may have started its own server already.
	port_open "$port" && return 0
	user=$(run_user)
	log="$(service_dir)/mariadb-$port.log"
	mkdir -p "$TS_MY_RUNDIR"
	: >>"$log"
	[[ -z $user ]] || chown "$user" "$TS_MY_RUNDIR" "$log"
	if pid=$(cat "$TS_MY_RUNDIR/mysqld.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; then
		say "mariadb: waiting for the running server (pid $pid)"
	else
		mariadb_init_datadir "$bin" "$user" "$log"
		say "mariadb: starting $bin on 127.0.0.1:$port (log: $log)"
		pid=$(mariadb_launch "$bin" "$port" "$user" "$log")
	fi
	wait_until 60 "$pid" port_open "$port" ||
		die "mariadb did not come up on 127.0.0.1:$port (it exited, or took over 60 s); end of $log:
$(tail -n 20 "$log")"
}

ensure_mariadb() {
	local port=${TASKSTREAM_TEST_MYSQL_PORT:-3306}
	mariadb_layout "$port"
	if port_open "$port"; then
		say "mariadb: using the server on 127.0.0.1:$port"
	else
		mariadb_start "$port"
	fi
	mariadb_root_login "$port" ||
		die "mariadb on 127.0.0.1:$port: root cannot log in over TCP with an empty password"
	mysql_tcp "$port" 'CREATE DATABASE IF NOT EXISTS test' ||
		die "mariadb on 127.0.0.1:$port: cannot create database test"
	export TASKSTREAM_TEST_MYSQL_URL="mysql://root@127.0.0.1:$port/test"
}

# --- PostgreSQL ----------------------------------------------------------------------------

# pg_login PORT ROLE: ROLE can log in to database postgres without a password.
pg_login() {
	if find_bin psql >/dev/null; then
		PGCONNECT_TIMEOUT=5 psql -X -w -q -h 127.0.0.1 -p "$1" -U "$2" -d postgres \
			-tAc 'SELECT 1' >/dev/null 2>&1
	else
		"${TASKSTREAM_PYTHON:-python3}" - "$1" "$2" >/dev/null 2>&1 <<'PY'
import asyncio
import sys

import asyncpg


async def main() -> None:
    conn = await asyncpg.connect(
        host="127.0.0.1", port=int(sys.argv[1]), user=sys.argv[2], database="postgres", timeout=5
    )
    await conn.close()


asyncio.run(main())
PY
	fi
}

detect_postgres() {
	local port=${TASKSTREAM_TEST_POSTGRES_PORT:-5432} role
	unset TASKSTREAM_TEST_POSTGRES_URL
	if ! port_open "$port"; then
		say "postgres: nothing on 127.0.0.1:$port; PostgreSQL tests will skip"
		return 0
	fi
	for role in postgres root; do
		if pg_login "$port" "$role"; then
			export TASKSTREAM_TEST_POSTGRES_URL="postgresql://$role@127.0.0.1:$port/postgres"
			say "postgres: using the server on 127.0.0.1:$port as $role"
			return 0
		fi
	done
	say "postgres: 127.0.0.1:$port answers but neither postgres nor root can log in; PostgreSQL tests will skip"
}

# --- libfaketime ---------------------------------------------------------------------------

# find_libfaketime: path of libfaketime.so.1, the library Debian's `faketime` preloads.
find_libfaketime() {
	local lib
	for lib in "${TASKSTREAM_TEST_LIBFAKETIME:-}" /usr/lib/*/faketime/libfaketime.so.1 \
		/usr/lib/faketime/libfaketime.so.1 /usr/local/lib/faketime/libfaketime.so.1; do
		[[ -n $lib && -f $lib ]] && printf '%s\n' "$lib" && return 0
	done
	return 1
}

ensure_faketime() {
	local lib
	if ! lib=$(find_libfaketime); then
		apt_install faketime && lib=$(find_libfaketime) ||
			die "libfaketime.so.1 not found and could not be installed (as root: apt-get install faketime; or set TASKSTREAM_TEST_LIBFAKETIME)"
	fi
	say "faketime: using $lib"
	export TASKSTREAM_TEST_LIBFAKETIME="$lib"
}
