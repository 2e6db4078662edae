//! A lane's driver task: it connects when calls come, serves them on the connection until it
//! breaks, and starts again.

use super::*;

/// What a lane's driver keeps from one connection to the next.
struct Driver {
    calls: mpsc::UnboundedReceiver<Call>,
    /// the calls taken from the channel and not written yet
    batch: Vec<Call>,
    alarm: Alarm,
    leases: Arc<lease::Lane>,
    follow: Follow,
    /// a Cluster's primary: the keys of one call must share a slot
    cluster: bool,
}

/// The driver: connects when calls come, serves them until the connection breaks, repeats.
pub(super) async fn drive(
    endpoint: Endpoint,
    calls: mpsc::UnboundedReceiver<Call>,
    leases: Arc<lease::Lane>,
) {
    let follow = match &endpoint.addr {
        Addr::Sentinel(sentinels) => {
            sentinels.listen(endpoint.tls.as_ref(), asking(&endpoint));
            sentinels.follow()
        }
        _ => Follow::fixed(),
    };
    let mut lane = Driver {
        calls,
        batch: Vec::with_capacity(BATCH),
        alarm: Alarm::new(),
        leases,
        follow,
        cluster: endpoint.cluster,
    };
    loop {
        if lane.batch.is_empty() && !lane.first_calls().await {
            return; // every handle dropped
        }
        // A caller that gave up has its request going on without it. Its call is not worth a
        // connection attempt. Once Redis is back, running it would take tokens twice.
        lane.batch.retain(|call| !call.slot.done());
        if lane.batch.is_empty() {
            continue;
        }
        let open = match lane.open(&endpoint).await {
            None => return,
            Some(None) => continue,
            Some(Some(Stream::Tcp(s))) => serve(s, &mut lane).await,
            Some(Some(Stream::Tls(s))) => serve(*s, &mut lane).await,
            Some(Some(Stream::Unix(s))) => serve(s, &mut lane).await,
        };
        if !open {
            return;
        }
    }
}

impl Driver {
    /// Waits for calls while there is no connection; false when every handle is dropped.
    async fn first_calls(&mut self) -> bool {
        tokio::select! {
            biased;
            n = self.calls.recv_many(&mut self.batch, BATCH) => if n == 0 {
                return false;
            },
            () = self.alarm.rung() => {
                self.alarm.expire(&mut self.batch, &mut VecDeque::new());
            }
        }
        self.alarm.set_for(&self.batch);
        true
    }

    /// Connects for the calls in the batch. `None` when every handle is dropped meanwhile;
    /// `Some(None)` when the attempt failed (its calls are answered with the error) or the
    /// Sentinels named another master while it was made.
    async fn open(&mut self, endpoint: &Endpoint) -> Option<Option<Stream>> {
        // Calls that come while connecting wait for this attempt if it succeeds, or make the
        // next one. A failed attempt answers only the calls that were there when it started:
        // an attempt started before Redis came back would fail the others for nothing.
        let mut later = Vec::new();
        let connecting = tokio::time::timeout(endpoint.connect_timeout, connect(endpoint));
        tokio::pin!(connecting);
        self.follow.on(None);
        let connected = loop {
            tokio::select! {
                biased;
                connected = &mut connecting => break Some(connected),
                // a failover while connecting: to the new master at once, not after the
                // attempt on the old one times out
                () = self.follow.moved() => break None,
                () = self.alarm.rung() => {
                    self.alarm.expire(&mut self.batch, &mut VecDeque::new());
                    self.alarm.expire(&mut later, &mut VecDeque::new());
                }
                n = self.calls.recv_many(&mut later, BATCH) => {
                    if n == 0 {
                        return None;
                    }
                    self.alarm.set_for(&later[later.len() - n..]);
                }
            }
        };
        let stream = match connected.map(|c| c.unwrap_or_else(|_| Err(slow(endpoint)))) {
            None => None,
            Some(Err(e)) => {
                for mut call in self.batch.drain(..) {
                    call.slot.reply(Err(e.clone()));
                }
                None
            }
            Some(Ok((stream, named))) => {
                self.follow.on(named.as_ref());
                Some(stream)
            }
        };
        self.batch.append(&mut later);
        Some(stream)
    }
}

/// The error of an attempt to connect that took too long.
fn slow(endpoint: &Endpoint) -> Error {
    Error::io(
        io::ErrorKind::TimedOut,
        format!(
            "connecting to Redis took over {:?}",
            endpoint.connect_timeout
        ),
    )
}

/// One connection's buffers and the commands written on it.
struct Session {
    /// what each command written is answered to, in order
    waiting: VecDeque<Waiting>,
    entries: Vec<(u64, Entry)>,
    /// the joins of one joined call, for coalesce (kept, so as not to allocate per call)
    joins: Vec<Join>,
    /// the commands being written, and how much of them is
    out: Vec<u8>,
    written: usize,
    input: Vec<u8>,
    /// whether the last batch held more than one call
    busy: bool,
    /// whether a call written is past its deadline, unanswered
    overdue: bool,
    /// the checks of joined calls that were refused, to be sent again alone
    again: Vec<Call>,
}

/// Serves calls on an open connection until it breaks (returns true: connect again when the
/// next call comes) or every handle is dropped (false). A connection to a master named by
/// Sentinels is also dropped when they name another, and when a call written on it is late:
/// the master may hang, and the next connection asks the Sentinels again.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, lane: &mut Driver) -> bool {
    let mut s = Session::new();
    loop {
        if s.waiting.is_empty() {
            s.overdue = false;
        }
        if s.may_write(lane) {
            if let Err(e) = s.write_batch(&mut stream, lane).await {
                return broken(&mut s.waiting, &e);
            }
        }
        // the socket: replies first, then what is left to write (one future, since both use it)
        let socket = poll_fn(|cx| {
            if let Poll::Ready(read) =
                tokio_util::io::poll_read_buf(Pin::new(&mut stream), cx, &mut s.input)
            {
                return Poll::Ready(Io::Read(read));
            }
            if s.written < s.out.len() {
                let rest = &s.out[s.written..];
                if let Poll::Ready(wrote) = Pin::new(&mut stream).poll_write(cx, rest) {
                    return Poll::Ready(Io::Wrote(wrote));
                }
            }
            Poll::Pending
        });
        tokio::select! {
            biased;
            io = socket => {
                let done = match io {
                    Io::Read(Ok(0)) | Io::Wrote(Ok(0)) => Err(closed()),
                    Io::Read(Ok(_)) => s.read(lane),
                    Io::Wrote(Ok(n)) => {
                        s.written += n;
                        Ok(())
                    }
                    Io::Read(Err(e)) | Io::Wrote(Err(e)) => Err(e.into()),
                };
                if let Err(e) = done {
                    return broken(&mut s.waiting, &e);
                }
            }
            () = lane.alarm.rung() => {
                s.overdue |= lane.alarm.expire(&mut lane.batch, &mut s.waiting);
                if let Some(end) = lane.leases.with(|l| l.expire(Instant::now())) {
                    lane.alarm.set(end);
                }
                if s.overdue && lane.follow.is_sentinel() {
                    return broken(&mut s.waiting, &hung());
                }
            }
            n = lane.calls.recv_many(&mut lane.batch, BATCH) => {
                if n == 0 {
                    return false;
                }
                lane.alarm.set_for(&lane.batch[lane.batch.len() - n..]);
            }
            () = lane.follow.moved() => return broken(&mut s.waiting, &moved()),
        }
    }
}

impl Session {
    fn new() -> Session {
        Session {
            waiting: VecDeque::with_capacity(BATCH),
            entries: Vec::with_capacity(BATCH),
            joins: Vec::with_capacity(BATCH),
            out: Vec::with_capacity(4096),
            written: 0,
            input: Vec::with_capacity(16 * 1024),
            busy: false,
            overdue: false,
            again: Vec::new(),
        }
    }

    /// Whether the next batch goes now. One batch is in flight at a time: calls made while it
    /// is answered wait for its replies, and then go together. Once Redis is late with a
    /// reply, batches go as they come. A Redis that stopped answering then has data not
    /// acknowledged, so `TCP_USER_TIMEOUT` breaks the connection, and the calls that came
    /// meanwhile are not held for it.
    fn may_write(&self, lane: &Driver) -> bool {
        self.written == self.out.len()
            && (!lane.batch.is_empty() || lane.leases.with(|l| l.returning()))
            && (self.waiting.is_empty() || self.overdue)
    }

    /// Writes the next batch, or starts to. Under load (the last batch held more than one
    /// call), it first waits a few turns of the scheduler. The tasks about to run make their
    /// calls meanwhile, so more checks of one bucket are joined and Redis runs fewer scripts.
    /// Without load, a call goes at once.
    async fn write_batch<S: AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
        lane: &mut Driver,
    ) -> Result<(), Error> {
        if self.busy && crate::turns::on() {
            for _ in 0..GATHER_TURNS {
                tokio::task::yield_now().await;
            }
        }
        while lane.batch.len() < BATCH {
            let Ok(call) = lane.calls.try_recv() else {
                break;
            };
            lane.alarm.set(call.slot.deadline);
            lane.batch.push(call);
        }
        self.out.clear();
        self.written = 0;
        self.busy = lane.batch.len() > 1;
        let cluster = lane.cluster;
        lane.leases.with(|leases| {
            let (out, waiting) = (&mut self.out, &mut self.waiting);
            queue(
                &mut lane.batch,
                &mut self.entries,
                &mut self.joins,
                leases,
                out,
                waiting,
                cluster,
            );
            for _ in 0..leases.write_returns(out) {
                waiting.push_back(Waiting::Nobody);
            }
        });
        // Most often the socket takes it all at once. What it does not take is written as it
        // drains, while replies are read and deadlines kept.
        if self.out.is_empty() {
            return Ok(());
        }
        let tried = poll_fn(
            |cx| match Pin::new(&mut *stream).poll_write(cx, &self.out) {
                Poll::Ready(result) => Poll::Ready(Some(result)),
                Poll::Pending => Poll::Ready(None),
            },
        )
        .await;
        match tried {
            None => Ok(()),
            Some(Ok(0)) => Err(closed()),
            Some(Ok(n)) => {
                self.written = n;
                Ok(())
            }
            Some(Err(e)) => Err(e.into()),
        }
    }

    /// Hands out the replies read. The checks of joined calls that were refused go first in
    /// the batch, before the calls that came after them, on this connection or the next: they
    /// ran nothing.
    fn read(&mut self, lane: &mut Driver) -> Result<(), Error> {
        let delivered = lane.leases.with(|l| {
            let (waiting, joins, again) = (&mut self.waiting, &mut self.joins, &mut self.again);
            deliver(&mut self.input, waiting, joins, l, again)
        });
        if !self.again.is_empty() {
            lane.batch.splice(0..0, self.again.drain(..));
        }
        if let Some(end) = delivered? {
            lane.alarm.set(end);
        }
        Ok(())
    }
}

/// What the socket did.
enum Io {
    Read(io::Result<usize>),
    Wrote(io::Result<usize>),
}

/// Fails every call waiting on a connection that broke; true: connect again.
fn broken(waiting: &mut VecDeque<Waiting>, error: &Error) -> bool {
    fail(waiting, error);
    true
}
