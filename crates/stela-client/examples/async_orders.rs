//! The async client end to end: starts a daemon in this process on a temporary directory
//! (a real deployment runs `stela serve`), then appends, commits at `disk`, reads back and
//! closes through `AsyncWal`.
//!
//! ```sh
//! cargo run -p stela-client --example async_orders
//! ```

use serde::{Deserialize, Serialize};
use stela_client::{AsyncWal, Durability, Lsn, WalOptions};

#[derive(Serialize, Deserialize, Debug)]
struct Order {
    id: u64,
    cents: i64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = stela_server::DaemonConfig::new(dir.path());
    config.assume_write_rate = Some(200_000_000);
    let server = stela_server::Server::start(config)?;
    let address = server.socket_path().to_str().unwrap_or_default().to_owned();

    let wal: AsyncWal<Order> =
        AsyncWal::open(address.as_str(), "orders", WalOptions::default()).await?;
    for id in 1..=3 {
        wal.append(&Order {
            id,
            cents: 100 * id as i64,
        })
        .await?; // buffered
    }
    let last = wal.last_lsn().await?;
    wal.commit_at(last, Durability::Disk).await?; // fdatasync'ed by the daemon
    println!("durable up to LSN {}", wal.durable_lsn().await?);
    let mut records = wal.iter_from(Lsn::FIRST);
    while let Some(item) = records.next().await {
        let (lsn, order) = item?;
        println!("{lsn}: {order:?}");
    }
    wal.close().await?;
    Ok(())
}
