//! SIGINT (Ctrl-C) and SIGTERM: what `kvb serve` shuts down on, and what `kvb chat` flushes its
//! chunk store on, so a session's cache reaches the disk tier however it ends.

/// Resolves at SIGINT or SIGTERM.
pub(crate) async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Runs `flush` and exits with status 130 at SIGINT or SIGTERM, from a thread of its own (the
/// main thread may be waiting on stdin or on a generation). Without it a signal would end the
/// process before the chunk store's RAM tier reached the disk.
pub(crate) fn flush_on_stop_signal(flush: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("kvb-stop-signal".into())
        .spawn(move || {
            runtime.block_on(stop_signal());
            eprintln!("\nkvb: stopping; flushing the chunk store");
            flush();
            std::process::exit(130);
        })?;
    Ok(())
}
