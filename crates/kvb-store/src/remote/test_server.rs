//! A throwaway Redis server for tests (cargo feature `test-support`): Debian's `redis-server`
//! (or `valkey-server`) on a free loopback port, without persistence, evicting least recently
//! used keys as a shared tier should, and killed on drop.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or killed, to be restarted) server.
pub struct RedisServer {
    program: String,
    port: u16,
    child: Option<Child>,
}

fn program() -> Result<String, String> {
    for p in ["redis-server", "valkey-server"] {
        let found = Command::new(p)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if found {
            return Ok(p.to_string());
        }
    }
    Err(
        "neither redis-server nor valkey-server is on PATH: install Debian's redis-server \
         package (.ci/run does)"
            .into(),
    )
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> Result<Self, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let mut s = RedisServer {
            program: program()?,
            port,
            child: None,
        };
        s.restart()?;
        Ok(s)
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// A connection for a test to look at or tamper with what is stored.
    pub fn connection(&self) -> Result<redis::Connection, String> {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .map_err(|e| format!("connecting to {}: {e}", self.url()))
    }

    /// Kills the server (SIGKILL: as a crash, nothing flushed) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port (empty: it keeps nothing across restarts).
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let child = Command::new(&self.program)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.program))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pong: Result<String, String> = self
                .connection()
                .and_then(|mut c| redis::cmd("PING").query(&mut c).map_err(|e| e.to_string()));
            match pong {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("{} on port {}: {e}", self.program, self.port))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
