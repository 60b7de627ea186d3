//! `kafka://HOST:PORT/TOPIC` addresses, as the command line takes them.
//!
//! May touch: nothing else in the crate.

use weir::{Error, Result};

/// A topic on a cluster: `kafka://HOST:PORT/TOPIC`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaUrl {
    /// The bootstrap broker, `host:port`.
    pub bootstrap: String,
    /// The topic.
    pub topic: String,
}

impl KafkaUrl {
    /// Whether `s` is meant as a Kafka address (it starts with `kafka://`).
    pub fn is_kafka(s: &str) -> bool {
        s.starts_with("kafka://")
    }

    /// Parses `kafka://HOST:PORT/TOPIC`; anything else is an error that shows the form.
    pub fn parse(s: &str) -> Result<KafkaUrl> {
        let bad = |why: &str| {
            Error::config(format!("'{s}' is not a Kafka topic address ({why}): expected kafka://HOST:PORT/TOPIC"))
        };
        let rest = s.strip_prefix("kafka://").ok_or_else(|| bad("it does not start with kafka://"))?;
        let (host_port, topic) = rest.split_once('/').ok_or_else(|| bad("no /TOPIC"))?;
        let (host, port) = host_port.rsplit_once(':').ok_or_else(|| bad("no :PORT"))?;
        if host.is_empty() {
            return Err(bad("no host"));
        }
        port.parse::<u16>().map_err(|_| bad(&format!("'{port}' is not a port")))?;
        let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if topic.is_empty() || topic.len() > 249 || !topic.chars().all(legal) {
            return Err(bad("a topic name is 1 to 249 of a-z, A-Z, 0-9, '.', '_', '-'"));
        }
        Ok(KafkaUrl { bootstrap: host_port.to_string(), topic: topic.to_string() })
    }
}

impl std::fmt::Display for KafkaUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kafka://{}/{}", self.bootstrap, self.topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_bad_ones_say_why() {
        let u = KafkaUrl::parse("kafka://127.0.0.1:9092/words").unwrap();
        assert_eq!((u.bootstrap.as_str(), u.topic.as_str()), ("127.0.0.1:9092", "words"));
        assert_eq!(u.to_string(), "kafka://127.0.0.1:9092/words");
        for (bad, why) in [
            ("kafka://host/words", "no :PORT"),
            ("kafka://host:x/words", "'x' is not a port"),
            ("kafka://host:9092", "no /TOPIC"),
            ("kafka://host:9092/", "a topic name"),
            ("kafka://host:9092/a b", "a topic name"),
            ("kafka://:9092/t", "no host"),
            ("http://host:9092/t", "does not start with kafka://"),
        ] {
            let e = KafkaUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("kafka://HOST:PORT/TOPIC"), "{bad}: {e}");
        }
    }
}
