//! Each established socket's training job, from its cgroup (host::jobs), summed per job
//! over one socket dump: the job's ranks on this host, the local addresses its sockets use
//! (how other hosts' probes name it), and per peer its connections and queued bytes.
//! `--training-job` names one job for every socket instead. At most `max_jobs` jobs are
//! kept; the sockets of the others are counted as no job's, and the jobs as folded.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

use crate::host::jobs::{Job, JobFinder};

use super::readings::{is_peer_address, peer_label, JobPeer, JobSeries};

/// How a socket's job is found.
pub enum Attribution {
    /// `--training-job`: every socket is the job's.
    Flag(Arc<Job>),
    Cgroups(JobFinder),
}

#[derive(Default)]
struct Tally {
    source: &'static str,
    ranks: BTreeSet<String>,
    addresses: BTreeSet<IpAddr>,
    peers: BTreeMap<IpAddr, JobPeer>,
}

pub struct JobTally {
    attribution: Attribution,
    max_jobs: usize,
    now: BTreeMap<String, Tally>,
    folded: BTreeSet<String>,
}

impl JobTally {
    pub fn new(attribution: Attribution, max_jobs: usize) -> Self {
        Self {
            attribution,
            max_jobs: max_jobs.max(1),
            now: BTreeMap::new(),
            folded: BTreeSet::new(),
        }
    }

    /// A dump starts.
    pub fn begin(&mut self) {
        self.now.clear();
        self.folded.clear();
        if let Attribution::Cgroups(f) = &mut self.attribution {
            f.begin_read();
        }
    }

    /// One established socket. Sockets on loopback or link-local addresses are no job's
    /// traffic between hosts (no other host's probe names them).
    pub fn add(
        &mut self,
        cgroup: Option<u64>,
        local: IpAddr,
        peer: IpAddr,
        receive: u64,
        send: u64,
    ) {
        if !is_peer_address(&peer) || !is_peer_address(&local) {
            return;
        }
        let job = match &mut self.attribution {
            Attribution::Flag(j) => Some(j.clone()),
            Attribution::Cgroups(f) => cgroup.and_then(|id| f.job(id)),
        };
        let Some(job) = job else {
            return;
        };
        if !self.now.contains_key(&job.name) && self.now.len() >= self.max_jobs {
            self.folded.insert(job.name.clone());
            return;
        }
        let t = self.now.entry(job.name.clone()).or_default();
        t.source = job.source;
        if let Some(r) = &job.rank {
            t.ranks.insert(r.clone());
        }
        t.addresses.insert(local);
        let p = t.peers.entry(peer).or_default();
        p.connections += 1;
        p.receive_queue_bytes += receive;
        p.send_queue_bytes += send;
    }

    /// How long this dump's walk of the cgroup tree took (s): a new cgroup's, once.
    pub fn walk_seconds(&self) -> f64 {
        match &self.attribution {
            Attribution::Cgroups(f) => f.walk_seconds(),
            Attribution::Flag(_) => 0.0,
        }
    }

    /// The dump's jobs, by name, and how many were folded.
    pub fn finish(&self) -> (Vec<JobSeries>, u64) {
        let jobs = self
            .now
            .iter()
            .map(|(name, t)| JobSeries {
                name: name.clone(),
                ranks: t.ranks.iter().cloned().collect(),
                source: t.source,
                addresses: t.addresses.iter().map(|a| peer_label(*a)).collect(),
                peers: t
                    .peers
                    .iter()
                    .map(|(ip, p)| JobPeer {
                        peer: peer_label(*ip),
                        ..p.clone()
                    })
                    .collect(),
            })
            .collect();
        (jobs, self.folded.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_sum_per_job_and_peer_and_jobs_past_the_cap_fold() {
        let flag = Arc::new(Job {
            name: "llm".into(),
            rank: None,
            source: "flag",
        });
        let mut t = JobTally::new(Attribution::Flag(flag), 4);
        t.begin();
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        t.add(None, a, b, 100, 5);
        t.add(Some(7), a, b, 20, 0);
        t.add(None, a, IpAddr::from([127, 0, 0, 1]), 9, 9);
        let (jobs, folded) = t.finish();
        assert_eq!(folded, 0);
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].addresses, ["10.0.0.1"]);
        assert_eq!(
            jobs[0].peers,
            [JobPeer {
                peer: "10.0.0.2".into(),
                connections: 2,
                receive_queue_bytes: 120,
                send_queue_bytes: 5
            }]
        );
        t.begin();
        assert!(t.finish().0.is_empty(), "a dump starts empty");

        // Two jobs kept at most: the third's sockets are counted as folded.
        let s = crate::config::JobSettings {
            from_cgroup: vec![crate::pathpattern::PathPattern::parse("{job}").unwrap()],
            ..Default::default()
        };
        let dir = std::env::temp_dir().join(format!("probe-jobtally-{}", std::process::id()));
        let mut ids = Vec::new();
        for j in ["j1", "j2", "j3"] {
            std::fs::create_dir_all(dir.join(j)).unwrap();
            ids.push(std::os::unix::fs::MetadataExt::ino(
                &std::fs::metadata(dir.join(j)).unwrap(),
            ));
        }
        let mut t = JobTally::new(Attribution::Cgroups(JobFinder::new(dir.clone(), &s)), 2);
        t.begin();
        for id in &ids {
            t.add(Some(*id), a, b, 1, 1);
        }
        t.add(Some(u64::MAX), a, b, 1, 1);
        let (jobs, folded) = t.finish();
        std::fs::remove_dir_all(&dir).unwrap();
        let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!((names.len(), folded), (2, 1), "{names:?}");
    }
}
