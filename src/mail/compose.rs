//! Turning a "summary ready" event into the email a person receives.

use super::OutgoingEmail;
use crate::domain::SummaryReady;

pub const SUMMARY_READY_SUBJECT: &str = "Your summary is ready";

/// The "summary ready" email for one event.
pub fn summary_ready_email(from: &str, event: &SummaryReady) -> OutgoingEmail {
    let SummaryReady {
        job_id,
        tenant,
        summary,
        ..
    } = event;
    // Whoever submitted the text chose what the summary says; the email says so, and whose
    // submission it was, so a recipient does not mistake it for the sending domain's word.
    let text = format!(
        "Hello,\n\nthis is an automated summary of text submitted by tenant \"{tenant}\".\n\n\
         Job: {job_id}\n\n{summary}\n\n-- \n\
         summaryd sent this email because tenant \"{tenant}\" named this address when it \
         submitted the text. The summary above was written by a machine from that text; it \
         is not a message from the operator of this service.\n"
    );
    OutgoingEmail {
        from: from.to_owned(),
        to: event.to.to_string(),
        subject: SUMMARY_READY_SUBJECT.to_owned(),
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Email, JobId, TenantId};

    #[test]
    fn email_carries_recipient_summary_and_job_id() {
        let job_id = JobId::from_scoped_key("k");
        let event = SummaryReady {
            job_id,
            tenant: TenantId::parse("acme").unwrap(),
            to: Email::parse("a@b.co").unwrap(),
            summary: "Q3 is up.".into(),
            accepted_at: None,
        };
        let email = summary_ready_email("me@x.io", &event);
        assert_eq!(email.from, "me@x.io");
        assert_eq!(email.to, "a@b.co");
        assert!(email.subject.contains("summary is ready"));
        assert!(email.text.contains("Q3 is up.") && email.text.contains(&job_id.to_string()));
        assert!(
            email
                .text
                .contains("automated summary of text submitted by tenant \"acme\""),
            "{}",
            email.text
        );
    }
}
